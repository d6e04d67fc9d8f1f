"""The graph-level layout choice (`vdla.compiler.targets.cpu.layout_choice`): a tuned
layer whose fastest record writes another layout than its neighbours read keeps it only
where it saves more than the conversions it costs, counted as the runner places them."""

from __future__ import annotations

import pytest

from vdla.compiler import pipeline
from vdla.compiler.targets.cpu.layout import PLAIN, conversion_ns
from vdla.compiler.targets.cpu.layout_choice import choose_layouts, layout_of, model_cost
from vdla.compiler.targets.cpu.program import plan_steps
from vdla.compiler.targets.cpu.schedule import choose_conv
from vdla.compiler.tuner import Record, Records, best_schedules


@pytest.fixture(scope="module")
def mobilenet(best):
    """MobileNet-v1 float32 and, for each convolution, its default (blocked) schedule
    and the plain chooser's."""
    graph = pipeline.graph_for(pipeline.load_model("mobilenet_v1"), best, precision="float32")
    layouts = {}
    for task in best.tasks(graph):
        if task.conv:
            blocked = task.default_schedule()
            plain = choose_conv(task.shape, task._isa, best.team, blocked=False)
            assert layout_of(blocked) != PLAIN and layout_of(plain) == PLAIN
            for node in task.nodes:
                layouts[node] = (blocked, plain)
    return graph, layouts


def _options(layouts, blocked_ns, plain_ns, **special):
    """Every node's two records, fastest first; `special`: node -> (blocked, plain) ns."""
    found = {}
    for node, (blocked, plain) in layouts.items():
        b, p = special.get(node.replace(".", "_"), (blocked_ns, plain_ns))
        found[node] = sorted([(blocked, b), (plain, p)], key=lambda o: o[1])
    return found


def test_a_layer_keeps_its_neighbours_layout_unless_leaving_it_pays(best, mobilenet):
    graph, layouts = mobilenet
    node = "features.5.pw.conv"
    # Going plain converts its input (the depthwise layer's output) to plain and its
    # output back.
    t_in, t_out = (graph.tensors[x] for x in (graph.node(node).inputs[0],
                                              graph.node(node).outputs[0]))
    vl = layout_of(layouts[node][0])
    cost = conversion_ns(t_in.shape, 4, vl, PLAIN) + conversion_ns(t_out.shape, 4, PLAIN, vl)
    # Everything else is fastest blocked; the node's plain record saves a little: kept
    # blocked. Saving more than the conversions cost: it goes plain.
    for saving, want in ((0.5 * cost, vl), (2.0 * cost, PLAIN)):
        options = _options(layouts, 100_000, 120_000,
                           features_5_pw_conv=(100_000, 100_000 - saving))
        chosen = best.choose_schedules(graph, options)
        assert layout_of(chosen[node][0]) == want, saving
        assert all(layout_of(s) == vl for n, (s, _) in chosen.items() if n != node)


def test_the_fastest_records_are_kept_when_they_agree(best, mobilenet):
    graph, layouts = mobilenet
    for blocked_ns, plain_ns in ((100_000, 120_000), (120_000, 100_000)):
        options = _options(layouts, blocked_ns, plain_ns)
        chosen = best.choose_schedules(graph, options)
        assert chosen == {n: found[0] for n, found in options.items()}


def test_the_conversions_counted_are_the_runners(best, mobilenet):
    """Alternate layers plain and blocked: the choice's count of conversions is the one
    the program's plan places, and the choice removes them all."""
    graph, layouts = mobilenet
    nodes = [n for n in graph.nodes() if best.supports(n, graph).ok]
    alternate = {name: layouts[name][k % 2] for k, name in enumerate(layouts)}
    memo: dict = {}
    _, count = model_cost(graph, nodes, alternate, {}, best.kernels, memo)
    kernels, _ = best.kernels(graph, nodes, schedules=alternate)
    assert count == sum(s.node is None for s in plan_steps(graph, nodes, kernels)) > 20
    # Records where alternate layers are each a little faster in the other layout.
    options = {name: [(alternate[name], 100_000),
                      (layouts[name][1 - k % 2], 101_000)]
               for k, name in enumerate(layouts)}
    chosen = choose_layouts(graph, nodes, options, best.kernels)
    schedules = {name: s for name, (s, _) in chosen.items()}
    assert model_cost(graph, nodes, schedules, {}, best.kernels, memo)[1] == 0


def test_best_schedules_weighs_the_layouts_of_the_records(best, mobilenet, tmp_path):
    """`best_schedules` reads every record of a task, fastest first, and the CPU target
    picks from them with its neighbours."""
    graph, layouts = mobilenet
    node = "features.5.pw.conv"
    with Records(tmp_path / "cpu.db") as db:
        for task in best.tasks(graph):
            if not task.conv:
                continue
            blocked, plain = layouts[task.nodes[0]]
            plain_ns = 99_000 if node in task.nodes else 150_000
            db.add(*(Record(target="cpu", workload=task.key, config=task.platform,
                            backend="wall", schedule=task.schedule_to_dict(s), cycles=ns,
                            status="ok") for s, ns in ((blocked, 100_000), (plain, plain_ns))))
        found = best_schedules(db, graph, best)
    assert layout_of(found[node][0]) != PLAIN and found[node][1] == 100_000
    assert all(layout_of(s) != PLAIN for s, _ in found.values())
