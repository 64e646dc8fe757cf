"""`moesim topology`: output, drawing, and every bad input as one line + exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from moesim.cli import main
from moesim.topology import load_topology
from moesim.topology.draw import draw_topology

GPU = {"id": "g0", "kind": "gpu"}
GPU1 = {"id": "g1", "kind": "gpu"}
SW = {"id": "sw", "kind": "nvswitch"}


def lk(src="g0", dst="sw", **kw):
    return {"src": src, "dst": dst, "kind": "nvlink", "bandwidth_GBps": 100, "latency_us": 1, **kw}


def explicit(links, nodes=(GPU, GPU1, SW)):
    return {"nodes": list(nodes), "links": links}


def write(tmp_path: Path, data, name="topo.yaml") -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(p)


def one_error_line(capsys) -> str:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err
    return lines[0]


def test_text_output_has_counts_units_and_routes(capsys):
    assert main(["topology", "dgx-h100", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "16 GPUs = 2 node(s) x 8 GPUs, routing rail" in out
    assert "nvlink   gpu-nvswitch          32      450.0  0.822    369.9   1.665" in out
    assert "per node to the fabric: 8 links, 380.0 GB/s" in out  # 8 NICs x 47.5 GB/s
    assert "bisection" in out and "380.0 GB/s per direction" in out
    assert ("route n0.gpu0 -> n1.gpu7: n0.gpu0 -> n0.nvswitch -> n0.gpu7 -> n0.nic7 -> "
            "leaf0.rail7 -> n1.nic7 -> n1.gpu7 (6 links, 6.13 µs, bottleneck 47.5 GB/s)") in out


def test_json_and_set_overrides(capsys):
    assert main(["topology", "fat-tree", "--json", "--set", "routing=shortest",
                 "--set", "nodes=8", "--set", "oversubscription=1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_gpus"] == 8 and d["routing"] == "shortest"
    up = [x for x in d["links"] if x["src"] == "leaf0" and x["dst"] == "spine0"]
    assert up[0]["line_rate_GBps"] == pytest.approx(4 * 50 / 1 / 2)


def test_draw_writes_png_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "t.png"
    assert main(["topology", "dgx-h100", "--nodes", "2", "--draw", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    out.write_bytes(b"mine")
    assert main(["topology", "dgx-h100", "--draw", str(out)]) == 2
    line = one_error_line(capsys)
    assert str(out) in line and "--draw" in line and "--force" in line
    assert out.read_bytes() == b"mine"
    assert main(["topology", "dgx-h100", "--draw", str(out), "--force"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_draw_topology_returns_the_axes_with_one_series_per_node_kind():
    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    t = load_topology("pcie-8gpu")
    assert draw_topology(t, ax) is ax
    assert len(ax.collections) == 3  # gpu, pcie_switch, cpu
    assert "pcie-8gpu" in ax.get_title()
    assert [h.get_label() for h in ax.get_legend().legend_handles][:3] == ["gpu", "pcie_switch", "cpu"]


BAD_FILES = [
    # (yaml data, field named in the message)
    (explicit([{k: v for k, v in lk().items() if k != "bandwidth_GBps"}]), "links[0].bandwidth_GBps"),
    (explicit([lk(bandwidth_GBps=-5)]), "links[0].bandwidth_GBps"),
    (explicit([lk(bandwidth_GBps=0)]), "links[0].bandwidth_GBps"),
    (explicit([lk(latency_us=-1)]), "links[0].latency_us"),
    (explicit([lk(efficiency=1.5)]), "links[0].efficiency"),
    (explicit([lk()], nodes=(GPU, GPU1, {"id": "sw", "kind": "router"})), "nodes[2].kind"),
    (explicit([lk(dst="nowhere")]), "links[0].dst"),
    (explicit([lk(), lk(src="g1")], nodes=(GPU, GPU1, SW, {"id": "sw", "kind": "nic"})), "nodes[3].id"),
    (explicit([lk()]), "links"),  # g1 is not linked: disconnected
    (explicit([lk(), lk(src="g1", bidirectional=False)]), "links"),  # g1 can send, not receive
    (explicit([lk(), lk(src="ghost")]), "links[1].src"),
    ({"nodes": [SW], "links": [lk()]}, "nodes"),  # no GPU at all
    ({"builder": "torus", "params": {}}, "builder"),
    ({"builder": "cluster", "routing": "random"}, "routing"),
    ({"builder": "cluster", "params": {"nodes": 1, "intra": "nvswitch"}}, "params.nvlink_GBps"),
    ({"builder": "cluster", "params": {"nvlink_GBps": 1, "nvlink_efficiency": 1,
                                       "nvlink_latency_us": 1, "gpus_per_node": 0}},
     "params.gpus_per_node"),
    ({"builder": "cluster", "params": {"nvlink_GBps": -1, "nvlink_efficiency": 1,
                                       "nvlink_latency_us": 1}}, "params.nvlink_GBps"),
    ({"builder": "cluster", "params": {"warp_drive": 1}}, "params.warp_drive"),
    ({"builder": "cluster", "params": {"nodes": "two"}}, "params.nodes"),
    ({"name": "x"}, "builder"),
    ({"builder": "cluster", "typo": 1}, "typo"),
    ("nodes: [ {id: g0, kind: gpu\n", "line"),
    ("- just\n- a list\n", ""),
]


@pytest.mark.parametrize(("data", "field"), BAD_FILES)
def test_bad_file_is_one_line_naming_file_and_field(tmp_path, capsys, data, field):
    path = write(tmp_path, data)
    assert main(["topology", path]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"moesim topology: error: {path}")
    assert f": {field}" in line and "expected" in line


@pytest.mark.parametrize(("args", "names"), [
    (["no-such-preset"], ["no-such-preset", "dgx-h100"]),
    # issue 12: a value given on the command line is blamed on the command line
    (["dgx-h100", "--set", "nvlink_GBps=0"], ["command line: --set nvlink_GBps"]),
    (["dgx-h100", "--set", "bogus=1"], ["command line: --set bogus"]),
    (["dgx-h100", "--set", "novalue"], ["--set", "KEY=VALUE"]),
    (["pcie-8gpu", "--set", "gpus_per_node=6"], ["command line: --set gpus_per_node"]),
    (["dgx-h100", "--set", "routing=random"], ["command line: --set routing"]),
    (["dgx-h100", "--nodes", "0"], ["command line: --nodes"]),
    (["example-explicit", "--nodes", "2"], ["command line: --nodes", "example-explicit.yaml"]),
    (["dgx-h100", "--draw", "out.txt"], ["out.txt", "--draw"]),
])
def test_bad_arguments_are_one_line(capsys, args, names):
    assert main(["topology", *args]) == 2
    line = one_error_line(capsys)
    for name in names:
        assert name in line
