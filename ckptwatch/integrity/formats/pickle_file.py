"""Plain pickle files in a checkpoint (``optimizer.pkl``, ``trainer_state.pickle``, or any file
beginning with a protocol 2-5 ``PROTO`` opcode that is not torch's legacy format).

Format: one or more pickles back to back (``pickle.dump`` called repeatedly), each ending with
the ``STOP`` opcode (``Lib/pickletools.py``). Whoever resumes calls ``pickle.load`` on it,
which runs any callable the pickle names; here every pickle is read with the restricted
unpickler (:func:`.safe_pickle.load_inert`, policy ``TORCH_PICKLE``: nothing is imported or
run) until the end of the file. Findings: ``unsafe_pickle`` (corrupt: a global that runs
code), ``bad_pickle`` (corrupt), ``truncated`` (incomplete: the file ends inside a pickle),
``limit_exceeded`` (unverifiable: a file over ``max_pickle_bytes``). Facts: ``pickles``
(count), ``foreign_globals`` (other globals, inert). No checksum: flipped bits that keep the
stream valid are invisible (the manifest's SHA-256 catches them).
"""

from __future__ import annotations

from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats.pickle_scan import PickleTruncated
from ckptwatch.integrity.formats.safe_pickle import TORCH_PICKLE, PickleLimitError, UnsafePickleError, load_inert_at
from ckptwatch.integrity.limits import Budget

#: File names checked as pickles whatever their first bytes.
EXTENSIONS = (".pkl", ".pickle")


def looks_like_pickle(head: bytes) -> bool:
    """True when ``head`` begins with a ``PROTO`` opcode of protocol 2 to 5."""
    return len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5


def check(f: BinaryIO, size: int, path: str, budget: Budget | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and facts for the pickle file ``f`` of ``size`` bytes (see the module docstring)."""
    budget = budget or Budget()
    if size > budget.limits.max_pickle_bytes:
        return [Finding(path, "unverifiable", "limit_exceeded", f"{size} bytes of pickle, more than the limit "
                        f"max_pickle_bytes={budget.limits.max_pickle_bytes}: not read")], {}
    foreign: set[str] = set()
    count = 0
    f.seek(0)
    data = f.read(size)  # read once: many small pickles must not each re-read a window
    pos = 0
    while pos < len(data):
        budget.check()
        start = pos
        try:
            _, u, pos = load_inert_at(data, start, source=path, policy=TORCH_PICKLE, keep_persistent=True)
        except UnsafePickleError as e:
            return [Finding(path, "corrupt", "unsafe_pickle", f"pickle {count + 1} (byte {start}) refers to "
                            f"{e.global_name}: refused, nothing was run (pickle.load would run it)")], {"pickles": count}
        except PickleLimitError as e:
            return [Finding(path, "unverifiable", "limit_exceeded", f"pickle {count + 1} (byte {start}): {e}")], {
                "pickles": count}
        except PickleTruncated:
            return [Finding(path, "incomplete", "truncated", f"the file ends inside pickle {count + 1} (which "
                            f"begins at byte {start}; {size} bytes in all)")], {"pickles": count}
        except Exception as e:  # whatever a malformed pickle raises
            return [Finding(path, "corrupt", "bad_pickle", f"pickle {count + 1} (byte {start}) is not a valid "
                            f"pickle: {type(e).__name__}: {e}"[:300])], {"pickles": count}
        foreign |= u.foreign
        count += 1
    return [], {"pickles": count, "foreign_globals": sorted(foreign)}
