"""Prints a command from README.md, so CI runs exactly what the README tells users.

README.md marks each command with an HTML comment on the line before its fenced block:
    <!-- command: test -->
    ```bash
    pytest tests
    ```
Usage: python dev/readme_command.py test|main
"""

import pathlib
import re
import sys

text = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
name = sys.argv[1]
m = re.search(r"<!-- command: %s -->\s*```(?:bash|sh)?\n(.*?)```" % re.escape(name), text, re.S)
if not m:
    sys.exit(f"README.md has no `<!-- command: {name} -->` block")
print(m.group(1).strip())
