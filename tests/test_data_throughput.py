"""The loader throughput script runs end to end with tiny settings and writes its CSV."""

import csv

from linvit.data import throughput


def test_throughput_script_writes_its_rows(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert throughput.main(["--out", str(out), "--images", "20", "--steps", "1", "--warmup", "0", "--batch", "4",
                            "--size", "32", "--source-px", "40", "--workers", "0,1"]) == 0
    rows = list(csv.DictReader(out.open()))
    whats = [(r["what"].split()[0] + " " + r["what"].split()[1], r["workers"]) for r in rows]
    assert whats == [("loader train", "0"), ("loader train", "1"), ("loader eval", "0"), ("loader eval", "1"),
                     ("train deit_tiny_patch16_224", "0")]
    assert all(float(r["images_per_s"]) > 0 and int(r["cpus"]) >= 1 and r["machine"] for r in rows)
    assert "images/s per worker" in capsys.readouterr().out
