"""What makes attention locality emerge in the demo's speech encoder: the study behind the demo's
defaults, one `dvc exp run` per row, on en-de.

    python scripts/locality_study.py                 # every row, in order (~2-2.5 h on 2 cores)
    python scripts/locality_study.py --rows A B      # some rows
    python scripts/locality_study.py --list          # the rows and their commands
    python scripts/locality_study.py --table         # only re-print the table from the saved results
    python scripts/locality_study.py --record W noise03 --minutes 13.9 --note "..."   # a row measured
        # as a DVC experiment (`dvc exp run -n noise03 ...`): its figures read from the experiment's commit

Each row is ``dvc exp run -n study-<row> -S 'pairs=[en-de]' -S 'seeds=[1]' -S <change> ... <target>``
run in this workspace, from the committed params.yaml (the workspace's params.yaml is restored after
each row). ASR rows stop at ``health_asr@en-de`` (the cheap check: the shared English ASR model's
attention health); ST rows stop at ``health_st@en-de`` (ST seed 1, select_windows, its health) and
``train_local@en-de-1`` (seed 1 retrained with local attention), and
reuse the ASR model of the row they build on. Every row sets every studied key explicitly, so rows
do not depend on the order they run in. Afterwards `dvc exp show` / `dvc metrics diff` compare them,
and this script writes the table to reports/locality_study.md (+ .json with the wall times).

Columns (layers 4-12 unless stated; lib/analysis/health.py): position share at layer 1, C_ii, raw
attention within ±2 over uniform, heads with >= 2x, contribution at offsets 1-2 over 6-8, Algorithm
1's windows, the inference band test (teacher-forced dev token accuracy with layers 4-12 local at
w = 1, 9 and Algorithm 1's windows, next to full attention), WER or BLEU, wall minutes of the row.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_JSON = ROOT / "reports" / "locality_study.json"
OUT_MD = ROOT / "reports" / "locality_study.md"

# The keys the study varies; every row states all of them (row A = the first demo's setting).
OLD_DEFAULT = {
    # `-S` merges dict values into params.yaml's, so the model options are set key by key;
    # rel_pos_bias is absent from params.yaml (off); row C adds it (Hydra's `+key=value`)
    "model.overrides.scale_embedding": "true",
    "model.overrides.subsampler_norm": "none",
    "corpus.sentences_per_segment": "[1,1]",
    "corpus.rate_jitter": "0",
    "corpus.word_gap": "[0,0]",
    "corpus.noise_level": "0.001",
    "train_asr.max_updates": "700",
    "train_st.init_decoder": "false",
    "train_st.lr": "3.0e-3",
    "train_st.max_frames": "6000",
    "train_st.max_updates": "180",
    "train_asr.specaug_time_p": "1.0",  # fairseq's 100-frame masks (row R: 0.1, the default since row R's ST test)
    "decode.max_len_b": "60",
    "train_asr.ctc_weight": "0.3",  # the demo's auxiliary encoder CTC loss, from the first demo on (row S: 0)
    # the study ran before local.asr_pretraining: fork became the default: local models start from
    # the baseline's ASR model (the paper), and no ASR run keeps a fork state
    "local.asr_pretraining": "shared",
    "asr.fork_updates": "0",
    # defaults that changed after the study (row AB, the depth setting, became the
    # default): the values every row ran with
    "corpus.splits.train": "1500",
    "train_asr.amp": "auto",
    "local.fork": "per_pair",
    "train_st.save_every": "60",
    "train_st.average_last": "2",
    "train_st.encoder_lr_scale": "1.0",  # one lr for the whole ST model (the paper's; the default now 0.2)
    "model.overrides.ctc_zero_init": "false",  # every row's CTC head started random (the default now zero)
}
LN = {"model.overrides.scale_embedding": "false", "model.overrides.subsampler_norm": "layernorm"}
VARIABILITY = {"corpus.rate_jitter": "20", "corpus.word_gap": "[0,3]", "corpus.noise_level": "0.005"}
TWO = {"corpus.sentences_per_segment": "[2,2]", "decode.max_len_b": "100"}
DEMO_ASR = {**LN, **TWO, **VARIABILITY, "train_asr.max_updates": "2400"}  # the demo default's ASR model
DEMO_ST = {**DEMO_ASR, "train_st.init_decoder": "true", "train_st.lr": "1.5e-3", "train_st.max_frames": "3000",
           "train_st.max_updates": "180"}  # the demo default's ST (from the demo's ASR model)

ROWS: list[tuple[str, str, dict[str, str], str]] = [
    ("A", "fairseq input (√d-scaled subsampler), 1 sentence per segment, 700 ASR updates (the first demo)",
     {}, "asr"),
    ("B", "LayerNorm on the subsampler output instead of √d", LN, "asr"),
    ("C", "B + learned relative-position bias (zero-init control)",
     {**LN, "+model.overrides.rel_pos_bias": "16"}, "asr"),
    ("D", "B, 2000 ASR updates", {**LN, "train_asr.max_updates": "2000"}, "asr"),
    ("E", "B + acoustic variability (rate ±20 wpm, word gaps 0-30 ms, noise 0.005), 1200 updates",
     {**LN, **VARIABILITY, "train_asr.max_updates": "1200"}, "asr"),
    ("F", "B + two sentences per segment (N ≈ 109), 1200 updates", {**LN, **TWO, "train_asr.max_updates": "1200"},
     "asr"),
    ("G", "F + acoustic variability", {**LN, **TWO, **VARIABILITY, "train_asr.max_updates": "1200"}, "asr"),
    ("H", "G, 2400 updates (the demo's ASR model)", DEMO_ASR, "asr"),
    ("I", "ST from H, a paper-like recipe (encoder from ASR; lr 3e-3, the paper's is 2e-3; 6000-frame batches)", DEMO_ASR, "st"),
    ("J", "I + decoder layers from the ASR model", {**DEMO_ASR, "train_st.init_decoder": "true"}, "st"),
    ("K", "J with lr 1.5e-3 and 3000-frame batches (180 updates)", DEMO_ST, "st"),
    ("M", "K with 6000-frame batches (twice the ST compute)",
     {**DEMO_ASR, "train_st.init_decoder": "true", "train_st.lr": "1.5e-3", "train_st.max_frames": "6000"}, "st"),
    ("O", "K with 3× the ST updates (540, for baseline and local alike)",
     {**DEMO_ST, "train_st.max_updates": "540"}, "st"),
    ("P", "K with 6× the ST updates (1080, for baseline and local alike)",
     {**DEMO_ST, "train_st.max_updates": "1080"}, "st"),
    ("L", "G, 3600 updates", {**LN, **TWO, **VARIABILITY, "train_asr.max_updates": "3600"}, "asr"),
    ("N", "M's ST from L (3600 ASR updates)",
     {**LN, **TWO, **VARIABILITY, "train_asr.max_updates": "3600", "train_st.init_decoder": "true",
      "train_st.lr": "1.5e-3", "train_st.max_frames": "6000"}, "st"),
    ("Q", "H with three sentences per segment (N ≈ 165, MuST-C-like)",
     {**DEMO_ASR, "corpus.sentences_per_segment": "[3,3]", "decode.max_len_b": "150"}, "asr"),
    ("R", "H with SpecAugment time masks capped at 10 % of the utterance (≤ 43 of ≈ 435 frames, not 100)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1"}, "asr"),
    ("S", "R without the auxiliary CTC loss on the encoder output (train_asr.ctc_weight 0, as in the paper)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "train_asr.ctc_weight": "0"}, "asr"),
    ("T", "R with the CTC loss on layer 8's output (intermediate CTC: layers 9-12 learn from the decoder only)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "+model.overrides.ctc_layer": "8"}, "asr"),
    ("U", "R with the CTC weight falling linearly from 0.3 at update 1200 to 0 at 2400 (the top layers left to the decoder's loss)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "train_asr.ctc_decay_from": "1200"}, "asr"),
    ("V", "R with kernel-3 subsampler convolutions (receptive field 7 frames, ≈ 95 ms, instead of 13, ≈ 145 ms)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "+model.overrides.conv_kernel": "3"}, "asr"),
    ("W", "R with heavier background noise (corpus.noise_level 0.03 instead of 0.005: six times the noise amplitude, 15.6 dB more noise)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "corpus.noise_level": "0.03"}, "asr"),
    ("X", "R with reverberation (every talk in a synthetic room, RT60 0.4-0.9 s, direct-to-reverberant 0 dB)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "corpus.reverb_rt60": "[0.4,0.9]"}, "asr"),
    ("Y", "R with twice the data and twice the updates (3000 training segments, 4800 ASR updates)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "corpus.splits.train": "3000", "train_asr.max_updates": "4800"},
     "asr"),
    ("Z", "ST from R's model (270 ST updates) with layer-wise lr decay: the encoder's top layer at the full "
          "ST lr, each layer below x 0.864 (layer 1 ≈ 0.2 x lr)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "train_st.init_decoder": "true", "train_st.lr": "1.5e-3",
      "train_st.max_frames": "3000", "train_st.max_updates": "270", "train_st.encoder_lr_scale": "1.0",
      "train_st.encoder_layer_lr_decay": "0.864"}, "st"),
    ("AA", "R with a third of the auxiliary CTC weight (train_asr.ctc_weight 0.1 instead of 0.3)",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "train_asr.ctc_weight": "0.1"}, "asr"),
    ("AB", "Y and AA together: CTC weight 0.1, 3000 training segments, 4800 ASR updates",
     {**DEMO_ASR, "train_asr.specaug_time_p": "0.1", "train_asr.ctc_weight": "0.1", "corpus.splits.train": "3000",
      "train_asr.max_updates": "4800"}, "asr"),
]


def row_command(name: str, change: dict[str, str], kind: str) -> list[str]:
    sets = {"pairs": "[en-de]", "seeds": "[1]", "asr.mode": "shared", "asr.shared_pair": "en-de",
            **OLD_DEFAULT, **change}
    cmd = ["dvc", "exp", "run", "-n", f"study-{name}"]
    for key, value in sets.items():
        cmd += ["-S", f"{key}={value}"]
    # ST rows also retrain seed 1 with local attention in layers 4-12 (Algorithm 1's windows): the
    # criterion that matters most (local within 1 BLEU of the baseline), one seed.
    return cmd + ([f"health_{kind}@en-de"] if kind == "asr" else ["health_st@en-de", "train_local@en-de-1"])


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def experiment_reader(name: str):
    """A reader of files at the commit of DVC experiment ``name`` (``refs/exps/.../<name>``; exits
    naming the known experiments when none or several match, :func:`health_draws.experiment_ref`)."""
    from health_draws import experiment_ref  # scripts/ (this script's folder is on sys.path)

    ref = experiment_ref(name)

    def read(path: Path) -> dict:
        shown = subprocess.run(["git", "show", f"{ref}:{path.relative_to(ROOT).as_posix()}"], cwd=ROOT,
                               capture_output=True, text=True)
        return json.loads(shown.stdout) if shown.returncode == 0 else {}
    return read


def collect(kind: str, read=None) -> dict:
    """The row's figures from the workspace right after its run (or through ``read``, e.g. from an
    experiment's commit: :func:`experiment_reader`)."""
    _read_ = read or _read
    health = _read_(ROOT / "metrics" / "health" / "en-de" / f"{kind}.json")
    out = {"summary": health.get("summary", {}), "windows": health.get("algorithm1_windows"),
           "band_test": {k: v["acc"] for k, v in health.get("band_test", {}).items()}}
    if kind == "asr":
        out["wer"] = _read_(ROOT / "metrics" / "asr_shared.json").get("wer")
    else:
        out["bleu"] = _read_(ROOT / "metrics" / "baseline" / "en-de" / "seed1.json").get("bleu")
        out["local_bleu"] = _read_(ROOT / "metrics" / "local" / "en-de" / "seed1.json").get("bleu")
    return out


def table(results: dict) -> str:
    head = ("| row | change | model | position share | C_ii | ±2 mass / uniform | heads ≥ 2× | offsets 1-2 / 6-8 | "
            "Alg. 1 windows (layers 4-12) | acc full / w=1 / w=9 / Alg. 1 | WER / BLEU (baseline, local) | minutes |")
    lines = [head, "|" + "---|" * 12]
    for name, desc, _, kind in ROWS:
        r = results.get(name)
        if not r:
            continue
        s, bt = r["summary"], r["band_test"]

        def f(v, fmt="{:.2f}"):
            return "–" if v is None else fmt.format(v)

        acc = " / ".join(f(bt.get(k), "{:.1f}") for k in ("full", "w1", "w9", "alg1"))
        score = (f"WER {f(r.get('wer'))}" if kind == "asr"
                 else f"BLEU {f(r.get('bleu'))}, local {f(r.get('local_bleu'))}")
        lines.append(f"| {name} | {desc} | {kind.upper()} | {f(s.get('position_share'))} | {f(s.get('c_ii_mean'))} | "
                     f"{f(s.get('band2_mean'))} | {s.get('local_heads', '–')}/{s.get('heads', '–')} | "
                     f"{f(s.get('falloff_mean'))} | {r.get('windows')} | {acc} | {score} | {r['minutes']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", help="row names (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--record", nargs=2, metavar=("ROW", "EXPERIMENT"),
                    help="store a row measured as a DVC experiment, read from the experiment's commit")
    ap.add_argument("--minutes", type=float, help="with --record: the experiment's wall minutes")
    ap.add_argument("--note", default="", help="with --record: the command and where it ran, stored with the row")
    ap.add_argument("--baseline-only", action="store_true",
                    help="with --record of an ST row: the experiment did not retrain the local model (its "
                         "metrics/local files are the baseline commit's), so no local BLEU is recorded")
    args = ap.parse_args(argv)
    if not args.record and (args.minutes is not None or args.note or args.baseline_only):
        ap.error("--minutes, --note and --baseline-only go with --record (without it every row would run)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from lib.io import atomic_write_text

    def write_json(path: Path, obj: dict) -> None:  # rows in the order they ran, as before
        atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

    if args.record:
        row, exp = args.record
        by_name = {r[0]: r for r in ROWS}
        if row not in by_name:
            sys.exit(f"error: unknown row {row!r}; known: {list(by_name)}")
        if args.minutes is None:
            sys.exit("error: --record needs --minutes (the experiment's wall time)")
        kind = by_name[row][3]
        got = collect(kind, experiment_reader(exp))
        if args.baseline_only:
            got["local_bleu"] = None
        if not got["summary"]:
            sys.exit(f"error: experiment {exp!r} has no metrics/health/en-de/{kind}.json")
        results = _read(OUT_JSON)
        results[row] = {**got, "minutes": round(args.minutes, 1), "command": args.note or f"dvc exp run -n {exp}"}
        write_json(OUT_JSON, results)
        md = table(results)
        atomic_write_text(OUT_MD, "# Locality study (scripts/locality_study.py)\n\n" + md)
        print(md)
        return
    known = [r[0] for r in ROWS]
    wanted = args.rows or known
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        sys.exit(f"error: unknown rows {unknown}; known: {known}")
    if args.list:
        for name, desc, change, kind in ROWS:
            print(f"{name}: {desc}\n   {' '.join(repr(c) if ' ' in c or '[' in c or '{' in c else c for c in row_command(name, change, kind))}")
        return
    results = _read(OUT_JSON)
    if not args.table:
        by_name = {r[0]: r for r in ROWS}
        for name in wanted:  # in the order given: ST rows reuse the ASR model the workspace holds
            _, desc, change, kind = by_name[name]
            cmd = row_command(name, change, kind)
            print(f"== row {name}: {desc}\n$ {' '.join(cmd)}", flush=True)
            t0 = time.perf_counter()
            try:
                rc = subprocess.run(cmd, cwd=ROOT).returncode
                minutes = (time.perf_counter() - t0) / 60
                if rc == 0:
                    results[name] = {**collect(kind), "minutes": round(minutes, 1), "command": " ".join(cmd)}
            finally:  # a failed or interrupted row leaves the committed params.yaml too, not the row's
                subprocess.run(["git", "checkout", "HEAD", "--", "params.yaml"], cwd=ROOT, check=True)
            if rc != 0:
                sys.exit(f"error: row {name} failed (rc={rc}); params.yaml is the committed one again")
            write_json(OUT_JSON, results)
    md = table(results)
    atomic_write_text(OUT_MD, "# Locality study (scripts/locality_study.py)\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
