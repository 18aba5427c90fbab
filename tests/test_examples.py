"""The examples run offline against ../shared, as the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import requires_shared

ROOT = Path(__file__).resolve().parents[1]


@requires_shared("models", "vit-tiny-tinyimagenet")
def test_load_any_size_example(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "load_any_size.py"), "--sparsities", "0.0", "0.3",
         "--num-images", "50", "--output", str(tmp_path / "elastic")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("sparsity")]
    assert len(lines) == 2
    assert "5.56 M params" in lines[0] and "2.511 GFLOPs" in lines[0]
    assert (tmp_path / "elastic" / "config.json").exists()
    assert (tmp_path / "elastic" / "preprocessor_config.json").exists()
