"""bench.e2e end to end on the CPU (tiny pair, a few tokens): the JSON it writes and the table it prints."""

import json

from workbench.bench import e2e


def test_e2e_pairs_on_cpu_write_rows_and_print_the_table(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    e2e.main(["--pairs", "tiny-hybrid:tiny-hybrid-dflash", "--n", "1", "--max-new-tokens", "6", "--budgets", "8",
              "--temperatures", "0", "--skip-hf", "--phase-prompts", "1", "--phase-budget", "8", "--both-norms", "--serial-host",
              "--dtype", "float32", "--out", str(out)])
    result = json.loads(out.read_text())
    rows = result["pairs"]["tiny-hybrid"]["rows"]
    variants = {r["variant"] for r in rows}
    # CPU: the run's own setting, the other, and the run's own with the host recording before queueing
    assert variants == {"reference_norms", "fused_norms", "reference_norms/serial_host"}
    serial = [r for r in rows if r["variant"].endswith("/serial_host")]
    assert [(r["method"], r["budget"]) for r in serial] == [("ar", None), ("dflash", None), ("ddtree", 8)]
    assert rows[0]["method"] == "ar" and rows[0]["variant"] == "reference_norms"
    for r in rows:
        assert r["tokens"] == 6 and r["tokens_per_second"] > 0
        if r["recurrent"] == "fork":  # fp32 on the CPU: exact, so every fork output is AR's
            assert r["identical_to_ar"] == 1, r
    unsafe = [r for r in rows if r["recurrent"] == "unsafe"]
    assert unsafe and all(r["variant"] == "reference_norms" for r in unsafe)
    assert result["pairs"]["tiny-hybrid"]["model_sha256"]  # budget auto checks these
    printed = capsys.readouterr().out
    assert "tiny-hybrid: tokens/s" in printed and "fused_norms" in printed and "identical 1/1" in printed
