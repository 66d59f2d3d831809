"""The build report compiles kernels for real GPUs without one (triton.compile + cuobjdump).

A quick subset here (the first and last variant of every kernel, for sm_80); the full report is
`python -m fastbert.kernels.report --arch sm_80,sm_90`.
"""
import pytest

pytest.importorskip("triton")

from fastbert.kernels import report  # noqa: E402

pytestmark = pytest.mark.triton

FIELDS = {"kernel", "arch", "config", "registers", "spill_bytes", "shared_bytes", "tensor_core", "ok", "error"}


@pytest.fixture(scope="module")
def quick_records():
    return report.run_report(archs=["sm_80"], quick=True, jobs=2)


@pytest.mark.slow
def test_quick_report_compiles_every_kernel_without_spills(quick_records):
    assert quick_records, "the report compiled nothing"
    for r in quick_records:
        assert FIELDS <= set(r), f"missing fields {FIELDS - set(r)} in {r}"
        assert r["arch"] == "sm_80"
        assert r["ok"], f"{r['kernel']} {r['config']} failed to compile: {r['error']}"
        assert r["error"] is None
        assert r["spill_bytes"] == 0, f"{r['kernel']} {r['config']} spills {r['spill_bytes']} bytes"
        assert 0 < r["registers"] <= 255
        assert r["shared_bytes"] >= 0
        # the attention products run on the tensor cores; nothing else has a matrix product
        assert r["tensor_core"] is (r["kernel"] in ("attention_fwd", "attention_bwd_dkdv", "attention_bwd_dq",
                                                    "disentangled_fwd", "disentangled_bwd_dq", "disentangled_bwd_dkdv"))
    names = {r["kernel"] for r in quick_records}
    assert {b.name for b in report.kernel_builds()} == names  # every kernel took part


def test_report_lists_every_setting_the_launchers_pick():
    from fastbert.kernels import bias_gelu, layer_norm

    builds = report.kernel_builds()
    listed = {(b.name, b.config.get("BLOCK_M"), b.config.get("BLOCK_N"), b.num_warps) for b in builds}
    for n in (1, 7, 64, 100, 384, 768, 1023, 1024, 3072, 4096, 4097, 8192):
        s = bias_gelu.settings(n)
        assert ("bias_gelu_fwd", s.block_m, s.block_n, s.num_warps) in listed
        s = bias_gelu.settings(n, backward=True)
        assert ("bias_gelu_bwd", s.block_m, s.block_n, s.num_warps) in listed
        s = layer_norm.settings(n)
        assert ("add_layer_norm_fwd", s.block_m, s.block_n, s.num_warps) in listed
        s = layer_norm.settings(n, backward=True)
        if s is None:  # wide rows: the two-pass backward
            for name, s in (("add_layer_norm_bwd_row_sums", layer_norm.ROW_SUMS_SETTINGS),
                            ("add_layer_norm_bwd_tiled", layer_norm.TILED_SETTINGS)):
                assert (name, None, s.block_n, s.num_warps) in listed
        else:
            assert ("add_layer_norm_bwd", None, s.block_n, s.num_warps) in listed


def test_report_lists_every_attention_setting_the_launchers_pick():
    import torch

    from fastbert.kernels import attention

    builds = report.kernel_builds()
    listed = {(b.name, b.config.get("dtype"), b.config.get("BLOCK_M"), b.config.get("BLOCK_N"), b.config.get("BLOCK_D"),
               b.num_warps, b.config.get("rope", False), b.config.get("window", False), b.config.get("rel_bias", False))
              for b in builds}
    # with and without rotary, a window and a relative bias (the preprocess kernel has none of them)
    flags = [(False, False, False)] + [(r, w, b) for r in (False, True) for w, b in ((True, False), (False, True),
                                                                                     (True, True))] + [(True, False, False)]
    for head_dim in attention.HEAD_DIMS:
        bd = attention.block_d(head_dim)
        for dt, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            for kernel in attention.KERNELS:
                for rope, window, rel in flags if kernel != "bwd_preprocess" else flags[:1]:
                    s = attention.settings(head_dim, dtype, kernel, rope, window or rel)
                    block_n = None if kernel == "bwd_preprocess" else s.block_n
                    want = (f"attention_{kernel}", dt, s.block_m, block_n, bd, s.num_warps, rope, window, rel)
                    assert want in listed, want


@pytest.mark.slow
def test_table_and_summary_format(quick_records):
    table = report.format_table(quick_records)
    summary = report.format_summary(quick_records)
    assert len(table.splitlines()) == len(quick_records) + 2
    assert "0 failed to compile, 0 spill" in summary
    assert not report.report_failed(quick_records)


def test_failures_and_spills_fail_the_report():
    good = {"ok": True, "spill_bytes": 0}
    assert not report.report_failed([good])
    assert report.report_failed([good, {"ok": True, "spill_bytes": 8}])
    assert report.report_failed([good, {"ok": False, "spill_bytes": None}])


@pytest.mark.slow
def test_the_saved_report_check_finds_stale_incomplete_and_untrue_reports(quick_records, tmp_path):
    # the quick records saved as if they were the full report: current, but incomplete; the
    # variants compiled again (the most-register one of each kernel, none at random) as recorded
    path = str(tmp_path / "report.json")
    report.write(path, quick_records, ["sm_80"])
    problems = report.check(path, sample=0, jobs=2)
    assert len(problems) == 1 and "misses" in problems[0], problems

    import json

    saved = json.load(open(path))
    worst = max(saved["records"], key=lambda r: r["registers"])
    worst["registers"] += 1
    json.dump(saved, open(path, "w"))
    problems = report.check(path, sample=0, jobs=2)
    assert any(f"registers {worst['registers']} -> {worst['registers'] - 1}" in p for p in problems), problems

    saved["fingerprint"] = "0" * 64
    json.dump(saved, open(path, "w"))
    (problem,) = report.check(path, sample=0, jobs=2)
    assert "built from other kernel sources" in problem and "--json" in problem
    assert "no such file" in report.check(str(tmp_path / "none.json"))[0]


def test_the_saved_report_is_current_and_complete():
    # the report kept with the sources must be rebuilt whenever a kernel or its settings change
    import json
    import os

    path = os.path.join(os.path.dirname(report.__file__), "build_report.json")
    saved = json.load(open(path))
    assert saved["fingerprint"] == report.fingerprint(), \
        f"rebuild it: python -m fastbert.kernels.report --arch sm_80,sm_90 --json {path}"
    assert {report.key(r) for r in saved["records"]} == \
        {report.job_key(b, a) for b, a in report.job_list(saved["archs"], None, False)}
    assert not report.report_failed(saved["records"])


def test_the_fingerprint_reads_device_code_not_prose_or_launchers():
    def code(source):
        return report.device_code({"m.py": source})

    kernel = ('"""A module."""\nimport triton\nSCALE = 2\nTABLE = {}\n@triton.jit\ndef k(X):\n    """Doc."""\n'
              '    tl.store(X, SCALE)  # one\ndef launch(x):\n    k[(1,)](x)\n')
    base = code(kernel)
    assert base == code(kernel.replace("# one", "# two").replace("Doc.", "Other."))  # prose
    assert base == code(kernel.replace("k[(1,)](x)", "k[(2,)](x)"))  # a launcher
    assert base == code(kernel.replace("TABLE = {}", "TABLE = {1: 2}"))  # a name no kernel reads
    assert base != code(kernel.replace("tl.store(X, SCALE)", "tl.store(X, 2 * SCALE)"))  # a kernel
    assert base != code(kernel.replace("SCALE = 2", "SCALE = 3"))  # a constant a kernel reads


def test_a_module_fingerprint_follows_its_own_code_and_what_it_imports():
    sources = report.package_sources()
    base = report.module_fingerprints(sources)
    assert set(base) == set(report.KERNEL_MODULES)

    def changed(path, old, new):
        assert old in sources[path], (path, old)
        now = report.module_fingerprints({**sources, path: sources[path].replace(old, new, 1)})
        return {m for m in base if now[m] != base[m]}

    assert changed("layer_norm.py", "mean = tl.sum(h, axis=1) / N", "mean = tl.sum(h, axis=1) / N / 1") == {"layer_norm"}
    # geglu imports bias_gelu's jit functions: a change there is a change of both
    assert changed("bias_gelu.py", "\n@triton.jit", "\n@triton.jit(do_not_specialize=[])") == {"bias_gelu", "geglu"}
    # the disentangled attention imports the attention package (its helpers; its __init__ runs first)
    assert changed("attention/rope.py", "\n@triton.jit", "\n@triton.jit(do_not_specialize=[])") == {
        "attention", "disentangled_attention"}
    assert changed("disentangled_attention.py", "\n@triton.jit", "\n@triton.jit(do_not_specialize=[])") == {
        "disentangled_attention"}
    assert changed("layer_norm.py", '"""Fused dropout', '"""Fused, dropout') == set()  # prose


def test_update_compiles_only_the_changed_modules_variants(tmp_path, monkeypatch):
    # the saved report with one module's recorded fingerprint changed: --update hands exactly that
    # module's variants to the compiler (here a stand-in that gives their records back) and keeps the rest
    import json
    import os
    import shutil

    path = str(tmp_path / "report.json")
    shutil.copy(os.path.join(os.path.dirname(report.__file__), "build_report.json"), path)
    saved = json.load(open(path))
    saved["modules"]["geglu"] = "0" * 64
    json.dump(saved, open(path, "w"))
    by_key = {report.key(r): r for r in saved["records"]}
    jobs = report.job_list(saved["archs"], None, False)
    compiled = []

    def fake_run_report(archs, select=None, jobs=None, progress=False, **kw):
        picked = [report.job_key(*jobs_all[i]) for i in select]
        compiled.extend(picked)
        return [dict(by_key[k]) for k in picked]

    jobs_all = jobs
    monkeypatch.setattr(report, "run_report", fake_run_report)
    records = report.update(path)
    assert {k[0] for k in compiled} == {"geglu_fwd", "geglu_bwd"}
    assert len(compiled) == sum(1 for b, _ in jobs if b.name.startswith("geglu"))
    again = json.load(open(path))
    assert again["modules"] == report.module_fingerprints() and again["fingerprint"] == report.fingerprint()
    assert [report.key(r) for r in again["records"]] == sorted(by_key, key=lambda k: (k[0], k[1], k[2])) == \
        [report.key(r) for r in records]
