"""`swiftspec profile calibrate` on CPU (small sizes): a hardware spec that the loader reads and
`profile derive` takes on either side, labelled calibrated on cpu, with what it did not measure
said; an existing output is not replaced by a calibration that measures less."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from swiftspec.profiler.calibrate import CalibrationOptions, calibrate
from swiftspec.sim.hardware import HardwareSpec
from swiftspec.spec import Profile


def test_calibrate_on_cpu_measures_what_one_device_shows():
    spec = calibrate("cpu", options=CalibrationOptions(copy_bytes=16 << 20, matmul_n=256, reps=3, warmup=1))
    assert spec.device == "cpu" and spec.source == "calibrated" and spec.name.startswith("cpu")
    assert set(spec.measured) == {"hbm_tb_s", "hbm_gib", "bf16_tflops", "sms", "launch_us"}  # no fp8, no link
    assert 1e-4 < spec.hbm_tb_s < 10 and 1e-5 < spec.bf16_tflops < 100 and 0.01 < spec.launch_us < 1000
    assert spec.fp8_tflops == spec.bf16_tflops and spec.sms >= 1 and spec.hbm_gib > 0.1
    h200 = HardwareSpec.load("builtin:h200")
    assert (spec.link_gb_s, spec.link_us) == (h200.link_gb_s, h200.link_us)
    assert "link_gb_s, link_us not measured (from NVIDIA H200, datasheet)" in spec.notes
    base = dataclasses.replace(h200, name="my base", link_gb_s=123.0)
    assert calibrate("cpu", base, CalibrationOptions(copy_bytes=1 << 20, matmul_n=64, reps=1, warmup=0)).link_gb_s == 123.0


def test_cli_writes_a_spec_derive_takes_on_both_sides(tmp_path, swiftspec_cli):
    """The written spec loads; derived from and to itself, a profile stays as it was; as the target
    it labels the derived profile `for cpu (...) (calibrated)`."""
    out = tmp_path / "cpu.json"
    code, stdout, err = swiftspec_cli("profile", "calibrate", "--device", "cpu", "-o", out)
    assert code == 0, err
    spec = HardwareSpec.load(out)
    assert spec.device == "cpu" and json.loads(out.read_text())["measured"] == list(spec.measured)
    assert "calibrate: copy of 64 MiB" in err and f"wrote {out}" in stdout and "fp8 not measured" in stdout
    code, _, err = swiftspec_cli("profile", "derive", "--from", "builtin:h200-measured", "--hardware", out,
                                 "--source-hardware", out, "-o", tmp_path / "same")  # fmt: skip
    assert code == 0, err
    src, same = Profile.load("builtin:h200-measured"), Profile.load(tmp_path / "same")
    np.testing.assert_allclose(same.compute["ms"], src.compute["ms"].astype(float), rtol=1e-9)
    assert same.label.endswith(f"for {spec.name} (calibrated)")


def test_derive_refuses_a_calibration_against_a_datasheet(tmp_path, swiftspec_cli):
    """A calibrated spec (achieved rates) on one side and a datasheet (peaks) on the other would
    scale every row by the wrong ratio: one line, exit 2, nothing written."""
    cal = tmp_path / "h100.json"
    cal.write_text(json.dumps(dataclasses.replace(
        HardwareSpec.load("builtin:h100-sxm"), source="calibrated", bf16_tflops=769.0, launch_us=1.0,
        measured=("hbm_tb_s", "hbm_gib", "bf16_tflops", "sms", "launch_us")).to_dict()))
    for side in ("--hardware", "--source-hardware"):
        other = "builtin:h100-sxm" if side == "--source-hardware" else None
        args = [side, cal, *(["--hardware", other] if other else [])]
        code, out, err = swiftspec_cli("profile", "derive", "--from", "builtin:h200-measured", *args,
                                       "-o", tmp_path / "never")
        assert code == 2 and "is calibrated and" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "never").exists()


def test_cli_refuses_to_replace_an_output_with_less(tmp_path, swiftspec_cli):
    """A file that is no spec, or a GPU calibration, is not replaced by a CPU calibration (one line,
    exit 2, the file as it was); an earlier CPU calibration is."""
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}\n')
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(dataclasses.replace(
        HardwareSpec.load("builtin:h100-sxm"), source="calibrated",
        measured=("hbm_tb_s", "hbm_gib", "bf16_tflops", "fp8_tflops", "sms", "launch_us")).to_dict()))
    for path, match in ((other, "is not a hardware spec"), (gpu, "measured fp8_tflops, which a calibration on cpu")):
        before = path.read_text()
        code, out, err = swiftspec_cli("profile", "calibrate", "--device", "cpu", "-o", path)
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1 and out == "", err
        assert path.read_text() == before
    cpu = tmp_path / "cpu.json"
    assert swiftspec_cli("profile", "calibrate", "--device", "cpu", "-o", cpu)[0] == 0
    cpu.write_text(json.dumps({**json.loads(cpu.read_text()), "hbm_tb_s": 999.0}))
    assert swiftspec_cli("profile", "calibrate", "--device", "cpu", "-o", cpu)[0] == 0
    assert HardwareSpec.load(cpu).hbm_tb_s < 999.0  # measured again
