"""English text-to-speech with eSpeak NG, called through ``ctypes``.

The eSpeak NG shared library and its ``espeak-ng-data`` directory come from the
``espeakng-loader`` wheel (``espeakng_loader.get_library_path()`` /
``get_data_path()``); nothing is downloaded and no ``espeak-ng`` executable or
system package is used.

eSpeak is driven in ``AUDIO_OUTPUT_SYNCHRONOUS`` (retrieval) mode: a synth
callback collects the int16 samples at eSpeak's native rate (22050 Hz in this
build), which are trimmed of leading/trailing silence and resampled with
``torchaudio.functional.resample``.

Determinism
-----------
eSpeak NG keeps some synthesis state in C ``static`` variables that are never
reset between utterances (most importantly the pitch-flutter table index
``Flutter_ix`` and the automatic gain control ``agc`` in ``wavegen.c``) and it
draws breath noise for the female variants from its own PRNG.  Left alone, the
same text and voice therefore give *different* samples depending on what was
synthesised before in the process.  Before every utterance this module

* sets voice, rate, pitch, range, volume and word gap,
* reseeds eSpeak's PRNG (``espeak_ng_SetRandSeed``), and
* restores the hidden wavegen statics to their load-time values; their
  addresses are found in the (unstripped) ELF symbol table of the wheel's
  library and their initial values are read from the same file.

With this, the same text and voice give bit-identical samples across calls, in
any order, and across processes (checked by ``tests/corpus/test_speech.py``).
Klatt variants (``+klatt*``) keep further state of their own and are not
covered by this guarantee; ``DEFAULT_VOICES`` uses none.

Process model
-------------
The C library is process-global.  It is initialised once per process, lazily,
by the first :class:`Synthesizer`; further instances share it.  Nothing here is
meant for concurrent use from several threads: calls are serialised by a module
lock, but parallel speed-ups come only from separate processes
(``multiprocessing`` workers), each of which creates its own
:class:`Synthesizer`.  A worker forked from a parent that already initialised
the library inherits a working copy of it.  Note that ``espeak_Initialize``
sets the C locale category ``LC_CTYPE`` of the process (to ``C.UTF-8``).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DEFAULT_VOICES", "Synthesizer", "Voice", "trim_silence"]


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker.

    Attributes:
        name: eSpeak voice name including an optional variant after ``+``,
            e.g. ``"en-us+f3"``.  Variants are files in
            ``espeak-ng-data/voices/!v`` (case-sensitive).
        rate: speaking rate in words per minute (eSpeak accepts 80-450).
        pitch: base pitch, 0-100 (eSpeak's default is 50).
        word_gap: extra pause between words in units of 10 ms (eSpeak's ``wordgap``, 0-50).
    """

    name: str
    rate: int
    pitch: int
    word_gap: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or self.name != self.name.strip():
            raise ValueError(f"invalid eSpeak voice name {self.name!r}")
        for field, value, lo, hi in (("rate", self.rate, 80, 450), ("pitch", self.pitch, 0, 100),
                                     ("word_gap", self.word_gap, 0, 50)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise ValueError(
                    f"voice {self.name!r}: {field} must be an int in [{lo}, {hi}], got {value!r}"
                )

    def __str__(self) -> str:
        return f"{self.name}@{self.rate}wpm/p{self.pitch}" + (f"/gap{self.word_gap}" if self.word_gap else "")


#: Distinct speakers (accent x variant x rate x pitch); each one was verified to
#: load in the espeakng-loader 0.2.4 build (``en-gb``/``en-gb+f2`` do not; the
#: British voice is called ``en``).
DEFAULT_VOICES: tuple[Voice, ...] = (
    Voice("en-us", 170, 50),  # American, default male
    Voice("en-us+f3", 165, 60),  # American, female
    Voice("en+f2", 160, 55),  # British, female
    Voice("en-us+m3", 180, 30),  # American, low male
    Voice("en-gb-scotland", 155, 45),  # Scottish male
    Voice("en-gb-x-rp+m2", 185, 40),  # British received pronunciation, male
    Voice("en-us+f5", 175, 72),  # American, high female
    Voice("en+f4", 150, 62),  # British, slow female
)

# --- eSpeak NG constants (speak_lib.h) -------------------------------------------------
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # return an error instead of calling exit()
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EE_OK = 0
_RATE, _VOLUME, _PITCH, _RANGE, _WORDGAP = 1, 2, 3, 4, 7
_RAND_SEED = 1
# eSpeak amplitude (0-200, default 100).  70 keeps the loudest default voice's peaks
# at about -2 dBFS, so eSpeak's automatic gain limiter never has to engage.
_VOLUME_VALUE = 70
_BUFFER_MS = 200

# Function-level statics of wavegen.c that survive between utterances (their ELF
# names carry a numeric suffix, e.g. "Flutter_ix.5965").
_HIDDEN_STATE = ("Flutter_ix", "agc", "cycle_count", "h_switch_sign", "amplitude2", "maxh", "maxh2")

# int SynthCallback(short *wav, int numsamples, espeak_EVENT *events)
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)

_TRIM_FRAME_MS = 5.0


def trim_silence(
    wave: np.ndarray, sample_rate: int, threshold_db: float = -40.0, margin_ms: float = 10.0
) -> np.ndarray:
    """Cut leading and trailing silence from a mono waveform.

    The signal is cut into 5 ms frames; a frame is *active* when its mean energy
    is at least ``threshold_db`` dB relative to the loudest frame.  Everything
    before the first and after the last active frame is dropped, except for a
    margin of ``margin_ms`` milliseconds on each side (clipped to the signal).

    Args:
        wave: 1-D array (any float or int dtype; the dtype is kept).
        sample_rate: samples per second of ``wave``.
        threshold_db: activity threshold in dB relative to the loudest frame (< 0).
        margin_ms: silence kept before the first and after the last active frame.

    Returns:
        A new array (a copy); empty when ``wave`` is empty or entirely zero.
    """
    x = np.asarray(wave)
    if x.ndim != 1:
        raise ValueError(f"trim_silence expects a 1-D waveform, got shape {x.shape}")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    if margin_ms < 0:
        raise ValueError(f"margin_ms must be >= 0, got {margin_ms}")
    if x.size == 0:
        return x.copy()
    frame = max(1, int(round(sample_rate * _TRIM_FRAME_MS / 1000.0)))
    n_frames = -(-x.size // frame)
    padded = np.zeros(n_frames * frame, dtype=np.float64)
    padded[: x.size] = x
    energy = np.mean(padded.reshape(n_frames, frame) ** 2, axis=1)
    peak = float(energy.max())
    if not peak > 0.0:
        return x[:0].copy()
    active = np.flatnonzero(energy >= peak * 10.0 ** (threshold_db / 10.0))
    margin = int(round(sample_rate * margin_ms / 1000.0))
    start = max(0, int(active[0]) * frame - margin)
    end = min(x.size, (int(active[-1]) + 1) * frame + margin)
    return x[start:end].copy()


# --- ELF symbol lookup (for the hidden-state reset) ------------------------------------


class _ElfSymbols:
    """The ``.symtab`` of an ELF64 little-endian shared object (empty for anything else)."""

    def __init__(self, path: str) -> None:
        self._data = data = Path(path).read_bytes()
        self._sections: list[tuple[int, ...]] = []
        self.symbols: dict[str, list[tuple[int, int, int]]] = {}  # name -> [(value, size, shndx)]
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return
        (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
        e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
        # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
        self._sections = [
            struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)
        ]
        for _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in self._sections:
            if sh_type != 2 or sh_entsize == 0:  # SHT_SYMTAB
                continue
            strtab = self._sections[sh_link][4]
            for j in range(sh_size // sh_entsize):
                st_name, _, _, st_shndx, st_value, st_size = struct.unpack_from(
                    "<IBBHQQ", data, sh_offset + j * sh_entsize
                )
                if not 0 < st_shndx < len(self._sections):  # undefined / absolute / common
                    continue
                end = data.index(b"\0", strtab + st_name)
                name = data[strtab + st_name : end].decode("ascii", "replace")
                self.symbols.setdefault(name, []).append((st_value, st_size, st_shndx))

    def offset(self, name: str) -> int | None:
        """Offset from the load base of a uniquely named symbol."""
        entries = self.symbols.get(name, [])
        return entries[0][0] if len(entries) == 1 else None

    def static_variable(self, prefix: str) -> tuple[int, bytes] | None:
        """(offset, initial bytes) of the unique variable named ``prefix`` or ``prefix.<n>``.

        GCC names function-level statics ``name.<n>``.  Initial bytes come from the
        file, or are zeros for ``.bss`` (``SHT_NOBITS``) variables.
        """
        matches = [
            entry
            for name, entries in self.symbols.items()
            if name == prefix or (name.startswith(prefix + ".") and name[len(prefix) + 1 :].isdigit())
            for entry in entries
        ]
        if len(matches) != 1 or matches[0][1] == 0:
            return None
        value, size, shndx = matches[0]
        _, sh_type, _, sh_addr, sh_offset = self._sections[shndx][:5]
        if sh_type == 8:  # SHT_NOBITS
            return value, bytes(size)
        start = sh_offset + (value - sh_addr)
        return value, self._data[start : start + size]


# --- the process-global engine ------------------------------------------------------


class _Engine:
    """The eSpeak NG library of this process (create through :func:`_get_engine`)."""

    def __init__(self, library_path: str, data_path: str) -> None:
        self.library_path = library_path
        self.data_path = data_path
        try:
            lib = ctypes.CDLL(library_path)
        except OSError as exc:
            raise RuntimeError(f"cannot load the eSpeak NG library {library_path!r}: {exc}") from exc
        if not Path(data_path).is_dir():
            raise RuntimeError(
                f"eSpeak NG data directory {data_path!r} (for library {library_path!r}) does not exist"
            )
        try:
            lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
            lib.espeak_Initialize.restype = ctypes.c_int
            lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
            lib.espeak_SetSynthCallback.restype = None
            lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
            lib.espeak_SetVoiceByName.restype = ctypes.c_int
            lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
            lib.espeak_SetParameter.restype = ctypes.c_int
            lib.espeak_Synth.argtypes = [
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
            ]  # fmt: skip
            lib.espeak_Synth.restype = ctypes.c_int
            lib.espeak_Synchronize.argtypes = []
            lib.espeak_Synchronize.restype = ctypes.c_int
            lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
            lib.espeak_ng_SetRandSeed.restype = None
        except AttributeError as exc:
            raise RuntimeError(f"{library_path!r} is not a usable eSpeak NG library: {exc}") from exc

        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, os.fsencode(data_path), _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise RuntimeError(
                f"espeak_Initialize failed (returned {rate}) for library {library_path!r} "
                f"with data {data_path!r}"
            )
        self.lib = lib
        self.sample_rate = int(rate)
        self._chunks: list[bytes] = []
        self._callback = _SYNTH_CALLBACK(self._on_samples)  # keep a reference: C holds the pointer
        lib.espeak_SetSynthCallback(self._callback)
        self._variants_dir = Path(data_path) / "voices" / "!v"
        self._hidden_state = self._locate_hidden_state()

    def _on_samples(self, wav, n: int, _events) -> int:
        if n > 0 and wav:
            self._chunks.append(ctypes.string_at(wav, 2 * n))
        return 0  # 0 = continue synthesis

    def _locate_hidden_state(self) -> list[tuple[int, bytes]]:
        """Absolute addresses and load-time values of the wavegen statics to restore."""
        problem = ""
        state: list[tuple[int, bytes]] = []
        try:
            symbols = _ElfSymbols(self.library_path)
            anchor = ctypes.cast(self.lib.espeak_Synth, ctypes.c_void_p).value
            anchor_offset = symbols.offset("espeak_Synth")
            if anchor is None or anchor_offset is None:
                problem = "espeak_Synth not found in its symbol table"
            else:
                load_base = anchor - anchor_offset
                for name in _HIDDEN_STATE:
                    found = symbols.static_variable(name)
                    if found is None:
                        problem = f"static variable {name!r} not found in its symbol table"
                        break
                    state.append((load_base + found[0], found[1]))
        except (OSError, ValueError, IndexError, struct.error) as exc:
            problem = f"cannot read its symbol table ({exc})"
        if problem:
            warnings.warn(
                f"eSpeak NG library {self.library_path!r}: {problem}; synthesis may depend on "
                "earlier utterances of this process (not bit-reproducible)",
                RuntimeWarning,
                stacklevel=4,
            )
            return []
        return state

    def check_voice(self, name: str) -> None:
        """Reject what espeak_SetVoiceByName would accept silently (unknown variants)."""
        base, plus, variant = name.partition("+")
        if not base:
            raise ValueError(f"eSpeak voice {name!r} does not load: no base voice before '+'")
        if plus:
            # eSpeak silently ignores an unknown variant and speaks the base voice.
            valid = variant and "/" not in variant and not variant.startswith(".")
            if not valid or not (self._variants_dir / variant).is_file():
                raise ValueError(
                    f"eSpeak voice {name!r} does not load: no variant {variant!r} in {self._variants_dir}"
                )

    def synth(self, text: str, voice: Voice) -> np.ndarray:
        """int16 samples at ``self.sample_rate`` for ``text`` spoken by ``voice`` (untrimmed)."""
        lib = self.lib
        self.check_voice(voice.name)
        status = lib.espeak_SetVoiceByName(voice.name.encode("utf-8"))
        if status != _EE_OK:
            raise ValueError(f"eSpeak voice {voice.name!r} does not load (espeak_SetVoiceByName -> {status})")
        # Every call sets the full parameter state.  Punctuation and capitals stay at
        # their init defaults (0): nothing here changes them and this build rejects
        # setting them through espeak_SetParameter.
        for param, value in (
            (_RATE, int(voice.rate)),
            (_PITCH, int(voice.pitch)),
            (_RANGE, 50),
            (_VOLUME, _VOLUME_VALUE),
            (_WORDGAP, int(voice.word_gap)),
        ):
            status = lib.espeak_SetParameter(param, value, 0)
            if status != _EE_OK:
                raise RuntimeError(f"espeak_SetParameter({param}, {value}) failed with {status} for {voice}")
        for address, init in self._hidden_state:
            ctypes.memmove(address, init, len(init))
        lib.espeak_ng_SetRandSeed(_RAND_SEED)

        payload = text.encode("utf-8") + b"\0"
        self._chunks = []
        status = lib.espeak_Synth(payload, len(payload), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        lib.espeak_Synchronize()
        chunks, self._chunks = self._chunks, []
        if status != _EE_OK:
            raise RuntimeError(f"espeak_Synth failed with {status} for voice {voice} and text {text!r}")
        return np.frombuffer(b"".join(chunks), dtype=np.int16)


def _resample(wave: np.ndarray, orig_freq: int, new_freq: int) -> np.ndarray:
    """``torchaudio.functional.resample`` on one intra-op thread.

    A single thread is as fast for utterance-sized inputs, and it keeps torch from
    starting its OpenMP worker pool here: a process whose OpenMP pool exists
    cannot safely ``fork`` (children hang in their first parallel torch op), and
    pipelines commonly synthesise in the parent before forking workers.  The
    thread setting is restored afterwards (it is per calling thread under OpenMP).
    The output does not depend on the thread count.
    """
    import torch
    import torchaudio.functional

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return torchaudio.functional.resample(
                torch.from_numpy(wave), orig_freq=orig_freq, new_freq=new_freq
            ).numpy()
    finally:
        torch.set_num_threads(previous)


_ENGINE: _Engine | None = None
_ENGINE_LOCK = threading.RLock()  # guards creation and every use of the C library


def _default_paths() -> tuple[str, str]:
    try:
        import espeakng_loader
    except ImportError as exc:  # pragma: no cover - dependency is pinned
        raise RuntimeError("the espeakng-loader package (eSpeak NG library + data) is not installed") from exc
    library_path = espeakng_loader.get_library_path()
    try:
        data_path = espeakng_loader.get_data_path()
    except RuntimeError as exc:
        raise RuntimeError(f"eSpeak NG data for library {library_path!r} is missing: {exc}") from exc
    return library_path, data_path


def _get_engine() -> _Engine:
    """The process-wide eSpeak NG instance, initialised on first use."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            _ENGINE = _Engine(*_default_paths())
        return _ENGINE


class Synthesizer:
    """English TTS with eSpeak NG, returning float32 waveforms at ``sample_rate`` Hz.

    One eSpeak NG instance (from the espeakng-loader wheel) backs all
    ``Synthesizer`` objects of a process: the C library is process-global and is
    initialised by the first construction, so constructing one per process (or
    several) is safe and cheap.  It is *not* thread-safe in the sense of running
    in parallel: calls from several threads are serialised by a lock; use one
    process per worker (each multiprocessing worker creates its own instance).

    Output is bit-identical for the same ``(text, voice)`` across calls and
    processes (see the module docstring for how eSpeak's hidden state is reset).

    Raises:
        RuntimeError: the library cannot be loaded or initialised (the message
            names the library path).
        ValueError: ``sample_rate`` is not a positive integer.
    """

    def __init__(self, sample_rate: int = 16000) -> None:
        is_int = isinstance(sample_rate, (int, np.integer)) and not isinstance(sample_rate, bool)
        if not is_int or sample_rate <= 0:
            raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")
        self.sample_rate = int(sample_rate)
        self._engine = _get_engine()

    @property
    def native_sample_rate(self) -> int:
        """eSpeak's own output rate (as returned by ``espeak_Initialize``)."""
        return self._engine.sample_rate

    @property
    def library_path(self) -> str:
        return self._engine.library_path

    def synthesize(self, text: str, voice: Voice) -> np.ndarray:
        """Speak ``text`` with ``voice``.

        Returns:
            float32 mono waveform in [-1, 1] at ``self.sample_rate`` Hz, with
            leading/trailing silence trimmed (:func:`trim_silence`, -40 dB, 10 ms
            margin).  Bit-identical for identical inputs.

        Raises:
            ValueError: the voice does not load (the message names it), the text is
                empty or contains NUL, or eSpeak produced no audible output.
        """
        if not isinstance(voice, Voice):
            raise TypeError(f"voice must be a Voice, got {type(voice).__name__}")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"cannot synthesise empty text {text!r} with voice {voice}")
        if "\0" in text:
            raise ValueError(f"text contains a NUL character (voice {voice}): {text!r}")
        with _ENGINE_LOCK:
            samples = self._engine.synth(text, voice)
        native = self._engine.sample_rate
        wave = trim_silence(samples.astype(np.float32) / np.float32(32768.0), native)
        if wave.size == 0:
            raise ValueError(f"eSpeak produced no audio for {text!r} with voice {voice}")
        if native != self.sample_rate:
            wave = _resample(wave, native, self.sample_rate)
        wave = np.clip(wave, -1.0, 1.0).astype(np.float32, copy=False)
        if wave.size == 0:
            raise ValueError(f"eSpeak produced no audio for {text!r} with voice {voice}")
        return np.ascontiguousarray(wave)
