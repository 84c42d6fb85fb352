"""Prints every `./bazelw run` command the given READMEs show, one per line:
lines of code blocks (a trailing backslash continues one) and inline code
spans (which may wrap across lines), comments dropped.

    python3 tools/readme_commands.py README.md engine/README.md ...
"""
import re
import sys


def commands(text):
    out = []
    in_block = False
    pending = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        if pending is not None:
            pending += " " + line.strip().rstrip("\\").strip()
            if not line.rstrip().endswith("\\"):
                out.append(pending)
                pending = None
            continue
        if line.startswith("./bazelw run "):
            command = line.split("#", 1)[0].rstrip() if " #" in line else line.rstrip()
            if command.endswith("\\"):
                pending = command.rstrip("\\").rstrip()
            else:
                out.append(command)
    # Inline spans, outside code blocks.
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"`(\./bazelw run [^`]+)`", prose):
        out.append(re.sub(r"\s+", " ", m.group(1)).strip())
    return out


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as handle:
            for command in commands(handle.read()):
                print(command)
