"""Read a pickle without running any of it: every global becomes an inert record.

A pickle is a program: its ``GLOBAL`` / ``STACK_GLOBAL`` opcodes import any callable and
``REDUCE`` / ``NEWOBJ`` / ``BUILD`` call it (``os.system``, ``builtins.eval``, ...). The
:class:`InertUnpickler` here never imports anything: ``find_class`` hands out, for each
allowed ``module.name``, a fresh subclass of :class:`Record` (or one of a few harmless
stand-ins, see ``_SAFE``), so "calling" a global only builds a record holding its
arguments, and ``BUILD`` only stores the state on the record. No callable from the file ever
runs, whatever the policy: the policy only decides which globals are expected (the rest
raise :class:`UnsafePickleError`, naming the global) and which are reported as foreign.

Policies (``Policy``): :data:`DCP_METADATA` (strict: the classes of
``torch.distributed.checkpoint.metadata`` and what they contain, everything else refused)
and :data:`TORCH_PICKLE` (``torch.save`` object graphs: torch's tensor/storage rebuild
helpers, dtypes, ``OrderedDict``; known code-execution globals refused; any other global
is *foreign*: kept inert and listed, since user classes are legal in a ``torch.save``).

Before any of that, :func:`.pickle_scan.scan` walks the opcodes once and refuses what
would make the unpickler itself allocate gigabytes or grind (memo bombs, lies about
lengths, hash-colliding integers): see :func:`load_inert`.

Pickle opcodes: ``Lib/pickletools.py`` of CPython; torch's globals: ``torch/_weights_only_unpickler.py``.
"""

from __future__ import annotations

import io
import pickle
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

from ckptwatch.integrity.formats.pickle_scan import PickleLimitError, PickleTruncated, scan

__all__ = ["DCP_METADATA", "TORCH_PICKLE", "InertUnpickler", "PickleLimitError", "Policy", "Record",
           "UnsafePickleError", "load_inert"]


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle names a global its policy refuses (e.g. ``posix.system``); nothing was run.

    ``source`` is the file (or member) read, ``global_name`` the refused ``module.name``.
    """

    def __init__(self, source: str, global_name: str, reason: str):
        self.source = source
        self.global_name = global_name
        super().__init__(f"{source}: the pickle refers to {global_name} ({reason}); it was not loaded "
                         "and nothing in it was run")


class Record:
    """An inert stand-in for an object of a pickled class (or for a pickled callable's result).

    The subclass names the global it stands for (``global_module``, ``global_qualname``);
    ``args`` / ``kwargs`` are what the pickle passed when "calling" or ``__new__``-ing it,
    ``state`` what ``BUILD`` gave (usually the instance ``__dict__``). Nothing else happens.
    """

    global_module: str = ""
    global_qualname: str = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Record:
        self = object.__new__(cls)
        self.args = args
        self.kwargs = kwargs
        self.state = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @classmethod
    def global_name(cls) -> str:
        return f"{cls.global_module}.{cls.global_qualname}"

    def fields(self) -> dict[str, Any]:
        """The instance attributes ``BUILD`` gave (dict state, or dict + slot state), else {}."""
        st = self.state
        out: dict[str, Any] = {}
        if isinstance(st, tuple) and len(st) == 2:
            for part in st:
                if isinstance(part, dict):
                    out.update({k: v for k, v in part.items() if isinstance(k, str)})
        elif isinstance(st, dict):
            out.update({k: v for k, v in st.items() if isinstance(k, str)})
        return out

    def __repr__(self) -> str:
        return f"<inert {self.global_name()}>"


def is_record(obj: Any, qualname: str | None = None, module: str | None = None) -> bool:
    """True when ``obj`` is a :class:`Record` (optionally of that qualname / module)."""
    if not isinstance(obj, Record):
        return False
    cls = type(obj)
    return (qualname is None or cls.global_qualname == qualname) and (module is None or cls.global_module == module)


def record_name(obj: Any) -> str | None:
    """``module.qualname`` of a record instance or record class, else None."""
    if isinstance(obj, Record):
        return type(obj).global_name()
    if isinstance(obj, type) and issubclass(obj, Record):
        return obj.global_name()
    return None


# --- harmless stand-ins for the few callables pickles use for plain data -------------------------

def _record_class(x: Any) -> bool:
    return isinstance(x, type) and issubclass(x, Record)


_NEW_OK = (OrderedDict, set, frozenset)


def _newobj(cls: Any, *args: Any) -> Any:
    """``copyreg.__newobj__`` for records and plain containers only."""
    if _record_class(cls):
        return cls.__new__(cls, *args)
    if cls in _NEW_OK:
        return cls.__new__(cls)
    raise pickle.UnpicklingError(f"copyreg.__newobj__ on {cls!r} is not allowed")


def _newobj_ex(cls: Any, args: Any = (), kwargs: Any = None) -> Any:
    if _record_class(cls) and isinstance(args, tuple) and isinstance(kwargs or {}, dict):
        return cls.__new__(cls, *args, **(kwargs or {}))
    raise pickle.UnpicklingError(f"copyreg.__newobj_ex__ on {cls!r} is not allowed")


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    """``copyreg._reconstructor`` (protocols 0/1) without calling ``base``."""
    if _record_class(cls):
        obj = cls.__new__(cls)
        obj.args = (state,) if state is not None else ()
        return obj
    raise pickle.UnpicklingError(f"copyreg._reconstructor on {cls!r} is not allowed")


def _encode(text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes`` (``(str, 'latin1')``)."""
    if isinstance(text, str) and encoding in ("latin1", "latin-1", "utf-8", "utf8", "ascii") and errors == "strict":
        return text.encode(encoding)
    raise pickle.UnpicklingError("_codecs.encode is only allowed on text with a plain codec")


def _bytearray(data: Any = b"") -> bytearray:
    if isinstance(data, (bytes, bytearray, list)):  # never bytearray(int): a huge allocation
        return bytearray(data)
    raise pickle.UnpicklingError("bytearray is only allowed from bytes")


def _complex(real: Any = 0, imag: Any = 0) -> complex:
    if isinstance(real, (int, float)) and isinstance(imag, (int, float)):
        return complex(real, imag)
    raise pickle.UnpicklingError("complex is only allowed from numbers")


def _container(kind: type) -> Callable[..., Any]:
    def make(items: Any = ()) -> Any:
        if isinstance(items, (list, tuple, set, frozenset, dict)):
            return kind(items)
        raise pickle.UnpicklingError(f"{kind.__name__} is only allowed from a list")
    return make


_SAFE: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): _container(set),
    ("builtins", "frozenset"): _container(frozenset),
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "complex"): _complex,
    ("copyreg", "__newobj__"): _newobj,
    ("copyreg", "__newobj_ex__"): _newobj_ex,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("_codecs", "encode"): _encode,
}

#: Python 2 module names protocol 0-2 pickles may use (``Lib/_compat_pickle.py``).
_PY2 = {"__builtin__": "builtins", "copy_reg": "copyreg"}


# --- policies -------------------------------------------------------------------------------------

Decision = Literal["allow", "foreign", "refuse"]

#: Modules and names that run code or touch the system when called: always refused.
_DANGEROUS_MODULES = re.compile(
    r"^(os|posix|nt|posixpath|ntpath|subprocess|sys|importlib|runpy|shutil|socket|pty|code|codeop|pickle|_pickle|"
    r"marshal|ctypes|multiprocessing|concurrent|webbrowser|pdb|bdb|timeit|signal|io|_io|tempfile|glob|platform|"
    r"operator|_operator|functools|types|inspect|ast|builtins|__builtin__|_?thread|threading|asyncio|urllib|http|"
    r"ftplib|smtplib|telnetlib|requests|commands|popen2|cProfile|profile|trace|zipimport|pkgutil|site|"
    r"torch\._C|torch\.hub|torch\.jit|torch\.ops|torch\.utils\.cpp_extension|torch\.serialization|"
    r"numpy\.testing|numpy\.f2py|numpy\.distutils)(\..*)?$")
_DANGEROUS_NAMES = {"eval", "exec", "compile", "getattr", "setattr", "delattr", "__import__", "open", "system",
                    "popen", "execfile", "input", "breakpoint", "apply", "globals", "locals", "vars", "load",
                    "loads"}
_TORCH_SCALAR = re.compile(
    r"^(u?int(8|16|32|64)|int|long|short|bool|half|float|double|cfloat|cdouble|chalf|bfloat16|"
    r"float(16|32|64)|complex(32|64|128)|float8_\w+|float4_\w+|q(u)?int\w+|bits\w+|"
    r"strided|sparse_\w+|_mkldnn|jagged|contiguous_format|channels_last(_3d)?|preserve_format|Size|device)$")
_TORCH_STORAGE = re.compile(r"^(\w+Storage)$")
_DCP_MODULES = {"torch.distributed.checkpoint.metadata"}
_DCP_NAMES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch.distributed.checkpoint.planner", "LoadItemType"),
    ("torch.serialization", "_get_layout"),
    ("builtins", "object"),
}
_PATHS = {("pathlib", n) for n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                                   "PureWindowsPath")}
_TORCH_REBUILD = {
    ("torch._utils", n) for n in (
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor", "_rebuild_nested_tensor",
        "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass", "_rebuild_device_tensor_from_numpy",
        "_rebuild_xla_tensor", "_rebuild_mtia_tensor")
} | {("torch._tensor", "_rebuild_from_type_v2"), ("torch._tensor", "_rebuild_from_type"),
     ("torch.nn.parameter", "Parameter"), ("torch.nn.parameter", "Buffer"), ("torch", "Tensor"),
     ("torch.serialization", "_get_layout"), ("torch.storage", "UntypedStorage"),
     ("torch.storage", "TypedStorage"), ("torch", "UntypedStorage"), ("builtins", "object"),
     ("collections", "defaultdict"), ("builtins", "slice"), ("builtins", "range")}


def _dotted_ok(name: str) -> bool:
    """A protocol-4 qualname: identifiers only, no dunder part (``Cls.__init__.__globals__``)."""
    parts = name.split(".")
    return all(p.isidentifier() and not p.startswith("__") for p in parts)


def _refused_always(module: str, name: str) -> str | None:
    if not _dotted_ok(name) and (module, name) not in _SAFE:
        return "attribute paths through dunders are never followed"
    if (module, name) in _SAFE or (module, name) in _DCP_NAMES or (module, name) in _TORCH_REBUILD:
        return None
    if _DANGEROUS_MODULES.match(module):
        return "a module that runs code or touches the system"
    if name.split(".")[-1] in _DANGEROUS_NAMES:
        return "a callable that runs code"
    return None


@dataclass
class Policy:
    """Which globals a pickle may name. ``decide(module, name)`` -> allow / foreign / refuse."""

    name: str
    decide: Callable[[str, str], Decision]


def _dcp_decide(module: str, name: str) -> Decision:
    if _refused_always(module, name):
        return "refuse"
    if module in _DCP_MODULES or (module, name) in _DCP_NAMES or (module, name) in _SAFE or (module, name) in _PATHS:
        return "allow"
    if module == "torch" and _TORCH_SCALAR.match(name):
        return "allow"
    return "refuse"  # anything else, other DCP modules included, is not what a .metadata holds


def _torch_decide(module: str, name: str) -> Decision:
    if _refused_always(module, name):
        return "refuse"
    if (module, name) in _SAFE or (module, name) in _TORCH_REBUILD or (module, name) in _PATHS:
        return "allow"
    if module == "torch" and (_TORCH_SCALAR.match(name) or _TORCH_STORAGE.match(name)):
        return "allow"
    return "foreign"


#: ``torch.distributed.checkpoint`` ``.metadata``: its dataclasses, torch.Size, dtypes; nothing else.
DCP_METADATA = Policy("dcp_metadata", _dcp_decide)
#: ``torch.save`` object graphs: torch's rebuild helpers allowed, code-running globals refused,
#: anything else foreign (inert, listed in ``InertUnpickler.foreign``).
TORCH_PICKLE = Policy("torch_pickle", _torch_decide)


# --- the unpickler --------------------------------------------------------------------------------

@dataclass
class _Persisted:
    """What ``persistent_load`` saw (torch's storage references)."""

    pids: list[Any] = field(default_factory=list)


class InertUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` returns inert records (see the module docstring).

    ``source`` names the file in errors; ``policy`` decides allowed / foreign / refused
    globals; ``foreign`` collects the foreign ``module.name`` seen; ``persisted`` collects
    persistent ids (``torch.save`` storage references) when ``keep_persistent`` is set, else a
    persistent id is an error. Raises :class:`UnsafePickleError` for a refused global and
    ``pickle.UnpicklingError`` / ``EOFError`` / ... for a malformed stream.
    """

    def __init__(self, file: Any, *, source: str, policy: Policy, keep_persistent: bool = False):
        super().__init__(file)
        self.source = source
        self.policy = policy
        self.foreign: set[str] = set()
        self.keep_persistent = keep_persistent
        self.persisted = _Persisted()
        self._types: dict[tuple[str, str], type[Record]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise pickle.UnpicklingError("a global with a non-text name")
        module = _PY2.get(module, module)
        full = f"{module}.{name}"
        decision = self.policy.decide(module, name)
        if decision == "refuse":
            reason = _refused_always(module, name) or f"not expected in a {self.policy.name} pickle"
            raise UnsafePickleError(self.source, full, reason)
        if decision == "foreign":
            self.foreign.add(full)
        safe = _SAFE.get((module, name))
        if safe is not None:
            return safe
        key = (module, name)
        t = self._types.get(key)
        if t is None:
            t = type(name.split(".")[-1], (Record,), {"global_module": module, "global_qualname": name})
            self._types[key] = t
        return t

    def persistent_load(self, pid: Any) -> Any:
        if not self.keep_persistent:
            raise pickle.UnpicklingError("persistent id in a pickle that should have none")
        self.persisted.pids.append(pid)
        return _PersistentRef(pid)


class _PersistentRef(Record):
    """What a persistent id (a torch storage reference) unpickles to."""

    global_module = "<persistent>"
    global_qualname = "id"


#: First bytes read for a pickle; doubled until its ``STOP`` is in the buffer.
FIRST_WINDOW = 1 << 20
#: Largest pickle read by default (bytes); see ``Limits.max_pickle_bytes``.
MAX_PICKLE = 1 << 30


def _load_from(src: Any, *, source: str, policy: Policy, keep_persistent: bool) -> tuple[Any, InertUnpickler]:
    u = InertUnpickler(src, source=source, policy=policy, keep_persistent=keep_persistent)
    return u.load(), u


def load_inert_at(data: bytes, pos: int, *, source: str, policy: Policy, keep_persistent: bool = False
                  ) -> tuple[Any, InertUnpickler, int]:
    """Unpickle inertly the pickle at ``data[pos:]`` (after :func:`.pickle_scan.scan`); returns
    the object, the unpickler and the offset one past its ``STOP``. Raises as :func:`load_inert`
    (scan errors carry offsets relative to ``pos``). Nothing is copied: ``io.BytesIO`` shares
    ``data``."""
    stop = scan(data, pos)
    src = io.BytesIO(data)
    src.seek(pos)
    obj, u = _load_from(src, source=source, policy=policy, keep_persistent=keep_persistent)
    return obj, u, stop


def load_inert(f: BinaryIO, *, source: str, policy: Policy, limit: int, keep_persistent: bool = False,
               max_bytes: int = MAX_PICKLE) -> tuple[Any, InertUnpickler]:
    """Unpickle one pickle from ``f`` (its current position, at most ``limit`` bytes) inertly.

    Returns the object (records for every global) and the unpickler (``foreign``,
    ``persisted``). ``f`` is left just after the pickle's ``STOP`` opcode (after an error:
    where reading stopped; at the end of what could be read when the pickle is cut short).
    Raises :class:`UnsafePickleError` for a refused global, :class:`.pickle_scan.PickleLimitError`
    over a bound (a pickle longer than ``max_bytes``, see also :mod:`.pickle_scan`),
    :class:`.pickle_scan.PickleTruncated` when it is cut short; other malformed input raises
    what ``pickle`` raises (``UnpicklingError``, ``EOFError``, ``ValueError``, ...).

    The pickle is read into memory, :data:`FIRST_WINDOW` bytes first, doubled until its
    ``STOP`` is in (so at most twice its size is read, and a pickle followed by gigabytes of
    storages, as in torch's legacy format, costs only itself). Each window's opcodes are
    first walked (:func:`.pickle_scan.scan`: no object built), which refuses what CPython's
    unpickler would allocate or grind on (a memo index of 4e8 in a 14-byte pickle, a
    ``BINBYTES8`` longer than the file, hash-colliding integers); only then is it unpickled.
    The file is read, never memory-mapped: a writer truncating it meanwhile cannot crash the
    process (SIGBUS).
    """
    start = f.tell()
    window = min(limit, FIRST_WINDOW, max_bytes)
    while True:
        f.seek(start)
        buf = f.read(window)
        try:
            scan(buf)
            break
        except PickleTruncated:
            if len(buf) < window or window >= limit:  # the file, or the pickle's room, really ends here
                f.seek(start + len(buf))
                raise
            if window >= max_bytes:
                f.seek(start)
                raise PickleLimitError(f"a pickle of more than {max_bytes} bytes, more than the limit "
                                       f"max_pickle_bytes={max_bytes}: not read") from None
            window = min(limit, 2 * window, max_bytes)
        except pickle.UnpicklingError:
            f.seek(start)
            raise
    src = io.BytesIO(buf)
    try:
        out = _load_from(src, source=source, policy=policy, keep_persistent=keep_persistent)
    finally:
        f.seek(start + src.tell())
    return out
