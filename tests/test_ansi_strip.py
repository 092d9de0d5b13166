"""ANSI escape sequences (terminal colours) are removed from line text at ingest; byte
offsets stay those of the file (new-user report: a coloured 'checkpoint-500\\x1b[0m' line
put the escape into the checkpoint path, remediation and incident id)."""

from __future__ import annotations

import io

import polars as pl

from ckptwatch.ingest.reader import read_lines
from ckptwatch.pipeline import diagnose

ESC = "\x1b"
PASTE = (
    "[INFO|trainer.py:3984] 2024-06-01 10:10:00,100 >> Saving model checkpoint to /mnt/nfs/out/checkpoint-400\n"
    "{'loss': 1.5, 'grad_norm': 1.0, 'learning_rate': 4.0e-05, 'epoch': 0.5}\n"
    "{C}[INFO|trainer.py:3984] 2024-06-01 10:20:00,100 >> Saving model checkpoint to /mnt/nfs/out/checkpoint-500{R}\n"
    "Traceback (most recent call last):\n"
    '  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3140, in _save_checkpoint\n'
    "    self.save_model(output_dir, _internal_call=True)\n"
    '  File "/opt/conda/lib/python3.11/site-packages/safetensors/torch.py", line 286, in save_file\n'
    "    serialize_file(_flatten(tensors), filename, metadata=metadata)\n"
    "{E}OSError: [Errno 116] Stale file handle{R}\n"
)


def _paste(c: str, e: str, r: str) -> str:
    return PASTE.replace("{C}", c).replace("{E}", e).replace("{R}", r)


def test_escape_sequences_of_every_form_are_removed():
    from ckptwatch.ingest.reader import strip_ansi

    raw = [
        f"{ESC}[32m[INFO] saved /a/checkpoint-500{ESC}[0m",
        f"{ESC}[1;31;48;5;200mX{ESC}[K",
        f"{ESC}]8;;http://x{ESC}\\link{ESC}]8;;\x07 ok",
        f"{ESC}(Bhi{ESC}7 there{ESC}M",
        'end' + ESC,
        '{"log":"\\u001b[31mErr\\u001b[0m"}',
        "plain [0m text stays",
    ]
    assert strip_ansi(pl.Series(raw)).to_list() == [
        "[INFO] saved /a/checkpoint-500", "X", "link ok", "hi there", "end", '{"log":"Err"}',
        "plain [0m text stays"]


def test_read_lines_strips_text_and_keeps_byte_offsets():
    data = f"a\n{ESC}[32mb /x/checkpoint-5{ESC}[0m\r\n{ESC}[2Kp 1%\r{ESC}[2Kp 2%\nc\n".encode()
    res = read_lines(io.BytesIO(data), 0)
    assert [t for _, t in res.lines] == ["a", "b /x/checkpoint-5", "p 1%", "p 2%", "c"]
    starts = [0, data.index(b"\x1b[32mb"), data.index(b"\x1b[2Kp 1"), data.index(b"\x1b[2Kp 2"), data.index(b"c\n")]
    assert [o for o, _ in res.lines] == starts
    assert res.next_offset == len(data)


def test_coloured_log_gives_the_same_incident_as_the_plain_one(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "p").mkdir()
    (tmp_path / "c" / "paste.txt").write_text(_paste(f"{ESC}[32m", f"{ESC}[31m", f"{ESC}[0m"))
    (tmp_path / "p" / "paste.txt").write_text(_paste("", "", ""))
    (coloured,), _ = diagnose([str(tmp_path / "c" / "paste.txt")])
    (plain,), _ = diagnose([str(tmp_path / "p" / "paste.txt")])
    assert coloured.checkpoint_path == plain.checkpoint_path == "/mnt/nfs/out/checkpoint-500"
    assert ESC not in coloured.remediation and ESC not in (coloured.root_cause.line or "")
    assert all(ESC not in e.line for e in coloured.evidence)
    assert (coloured.kind, coloured.step, coloured.id) == (plain.kind, plain.step, plain.id)
