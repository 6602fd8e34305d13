import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readmes_test_command_verbatim():
    warm_command, test_command = readme_commands()[:2]
    assert "kprecompile warm" in warm_command and "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()
