import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
# The tables of every environment variable and setting live in the reference, not the README.
REFERENCE = ROOT / "docs" / "reference.md"


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readmes_test_command_verbatim():
    warm_command, test_command = readme_commands()[:2]
    assert "kprecompile warm" in warm_command and "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_reference_lists_every_registered_variable_with_its_default():
    from kprecompile.inputs.environment import VARIABLES

    reference = REFERENCE.read_text()
    for variable in VARIABLES:
        default = {"1": "on", "0": "off", None: "unset"}.get(variable.default, variable.default)
        assert f"| `{variable.name}` | {variable.owner} | {default} |" in reference, variable.name


def test_reference_lists_every_setting():
    from kprecompile.inputs.settings import SETTINGS

    reference = REFERENCE.read_text()
    for setting in SETTINGS:
        assert f"| `{setting.name}` |" in reference, setting.name
