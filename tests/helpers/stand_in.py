"""Running a script outside the Triton interpreter: for the checks against the stand-in driver
(fastbert.bench.launch), which compile the kernels for sm_90 and load a stand-in libcuda into the
process that uses it."""
import os
import subprocess
import sys


def outside_interpreter(*args) -> str:
    """python *args in a process of its own without TRITON_INTERPRET -> its stdout; it must succeed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def script_ends_ok(folder, name: str, text: str) -> None:
    """Write `text` to folder/name, run it outside the interpreter, and require its output to end in ok."""
    script = folder / name
    script.write_text(text)
    out = outside_interpreter(str(script))
    assert out.strip().endswith("ok"), out
