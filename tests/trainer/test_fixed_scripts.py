"""``builtin:fixed-scripts``: the smoke-run policy samples whole scripts from a directory, each equally
often before training, and refuses a bad directory naming spec.policy.scripts."""

from collections import Counter

import pytest
import torch

from wmrl.api.schema import PolicySpec
from wmrl_demo.fixed_scripts import read_scripts
from wmrl_trainer.policy import load_policy

SCRIPTS = {
    "a_model.py": "import pandas as pd\ntrain = pd.read_csv('data/train.csv')\nprint(len(train))\n",
    "b_sample.py": "import shutil\nshutil.copy('data/sample_submission.csv', 'submission.csv')\n",
    "c_crash.py": "raise SystemExit('no')\n",
    "d_print.py": "print('no submission')",  # no final newline: one is added
}


def write_smoke_scripts(directory):
    for name, source in SCRIPTS.items():
        (directory / name).write_text(source)
    (directory / "notes.txt").write_text("not a script\n")
    return directory


def test_every_completion_is_one_whole_script_drawn_uniformly(tmp_path):
    model, tok = load_policy("builtin:fixed-scripts", scripts=str(write_smoke_scripts(tmp_path)))
    scripts = {source for _, source in read_scripts(tmp_path)}
    assert scripts == {s if s.endswith("\n") else s + "\n" for s in SCRIPTS.values()}
    torch.manual_seed(0)
    n = 800
    enc = tok(["Binary classification. Metric: accuracy (higher is better)."] * n, return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, max_new_tokens=4)
    completions = out[:, enc["input_ids"].shape[1]:]
    texts = tok.batch_decode(completions, skip_special_tokens=True)
    assert set(texts) == scripts  # nothing but whole scripts, every one of them
    # One token each, then generation stops (the script token is a stop token): the rest is padding.
    assert all(len([t for t in row if t != tok.pad_token_id]) == 1 for row in completions.tolist())
    counts = Counter(texts)
    # Uniform at first: 200 expected each; +-4.5 standard deviations (sd = 12.2).
    assert all(145 <= c <= 255 for c in counts.values()), counts


def test_a_bad_scripts_directory_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="spec.policy.scripts: .* is not a directory"):
        load_policy("builtin:fixed-scripts", scripts=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"spec.policy.scripts: no \*.py scripts in"):
        load_policy("builtin:fixed-scripts", scripts=str(tmp_path))
    write_smoke_scripts(tmp_path)
    (tmp_path / "e_copy.py").write_text((tmp_path / "b_sample.py").read_text())
    with pytest.raises(ValueError, match=r"\['b_sample.py', 'e_copy.py'\] .* are the same script"):
        read_scripts(tmp_path)
    with pytest.raises(ValueError, match="spec.policy.scripts: builtin:fixed-scripts needs a directory"):
        load_policy("builtin:fixed-scripts")
    with pytest.raises(ValueError, match="spec.policy.scripts: set it"):
        PolicySpec.model_validate({"model": "builtin:fixed-scripts"})
    with pytest.raises(ValueError, match="spec.policy.scripts: set it"):
        PolicySpec.model_validate({"model": "builtin:tiny-coder", "scripts": str(tmp_path)})
