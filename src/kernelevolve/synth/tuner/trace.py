"""Recognize a reference: trace `Model.forward` to aten ops and map them onto the tuner's `OpGraph`.

`recognize(spec)` traces the reference once per spec shape with `make_fx` on the meta device (no
memory, no compute), with parameters passed explicitly through `torch.func.functional_call` and the
core aten decompositions applied, so `softmax`, `layer_norm`, `rms_norm`, `gelu`, `silu`, `linear` and
their neighbours arrive as a few aten ops. Rewrites then simplify the graph: reductions over
size-1 dims become views (`aten_unit`), reductions over dims a view merged become reductions over
the dims merged (`aten_merge`), and attention's decomposed scale, softmax guard and broadcast mask
become what the pipeline's stages map (`aten_attention`). The mapper `aten_route.mapper_for` picks (`aten_map.GraphMapper`,
or `aten_reduce.ReduceMapper` for reductions over other dims than the output's last, `aten_arg`,
`aten_squeeze`) maps each graph onto the IR (`ir.py`), and where no one template covers it,
`stages.map_graph` cuts it into a pipeline of templated stages (a convolution, then a pooling). Every shape must give the same graph (the same stages); only the sizes
(rows, cols, K, batch) differ, and they are filled per shape name (per stage). The reference's
constructor becomes ModelNew's (`init_source`), so the harness can copy the reference's weights into
a generated candidate by name.

Deliberately not here: anything the templates cannot generate. Gathers, reductions over two sets of dims,
integer or float64 data, outputs of different shapes, a stage that no template covers, training specs
(backward) and data-dependent control flow give `None` with the reason, and the tuner then
seeds only from candidates that declare tunables. Running the reference is the harness's business;
this module only traces it on fake tensors (the spec file itself is imported: specs are trusted).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import textwrap
import threading
from types import ModuleType
from typing import Any

from kernelevolve import pyast
from kernelevolve.spec import ShapeSpec, Spec, call_get_init_inputs, call_get_inputs, import_spec_module
from kernelevolve.synth.tuner import shape_consts, shape_views
from kernelevolve.synth.tuner.aten_attention import rewrite_attention
from kernelevolve.synth.tuner.aten_conv import unify_same_padding
from kernelevolve.synth.tuner.aten_map import Unsupported
from kernelevolve.synth.tuner.aten_merge import split_merged_reductions
from kernelevolve.synth.tuner.aten_route import mapper_for
from kernelevolve.synth.tuner.aten_unit import drop_unit_reductions
from kernelevolve.synth.tuner.describe import describe
from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.stages import map_graph


def recognize(spec: Spec) -> tuple[OpGraph | None, str]:
    """The spec's reference as an OpGraph (with the description as the second item), or None and
    the reason it cannot be templated."""
    if spec.backward:
        return None, "training specs (backward) are not templated: the tuner generates forward kernels"
    try:
        module = import_spec_module(spec.path)
        traced = [_trace_shape(spec, module, shape) for shape in spec.shapes]
        graphs = [g for g, _ in traced]
        if any(_structure(g) != _structure(graphs[0]) for g in graphs[1:]):
            graphs = _without_unit_dims(spec, module, graphs, [shapes for _, shapes in traced])
        if any(_structure(g) != _structure(graphs[0]) for g in graphs[1:]):
            # Views whose sizes depend on the shape (heads split out of a packed projection).
            graphs = shape_views.unify(graphs)
            graphs = unify_same_padding(graphs)  # a convolution's SAME padding at several kernel sizes
        if any(_structure(g) != _structure(graphs[0]) for g in graphs[1:]):
            # A constant computed from a size (attention's 1/sqrt(head dim)): made from it at each call.
            unified = shape_consts.unify(graphs, [shapes for _, shapes in traced])
            if unified is not None and all(_structure(g) == _structure(unified[0]) for g in unified[1:]):
                graphs = unified
            else:
                differs = next(
                    s
                    for s, g in zip(spec.shapes, graphs, strict=True)
                    if _structure(g) != _structure(graphs[0])
                )
                raise Unsupported(
                    f"shape {differs.name!r} traces to a different graph than {spec.shapes[0].name!r} "
                    "(a constant or an op depends on the shape, and not as a power of one of the inputs' sizes, "
                    "or a view's sizes depend on it otherwise than as products of its root's sizes)"
                )
        graph = graphs[0]
        for g in graphs[1:]:
            for mine, theirs in zip([graph, *graph.stages], [g, *g.stages], strict=True):
                for attr in ("rows", "cols", "inner", "batch"):
                    getattr(mine, attr).update(getattr(theirs, attr))
        graph.init_source = _init_source(module)
    except Unsupported as exc:
        return None, str(exc)
    except Exception as exc:  # the tracer's own failures: data-dependent control flow, unknown ops
        return None, f"tracing the reference failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    for stage in graph.stages:
        stage.description = describe(stage)
    graph.description = describe(graph)
    return graph, graph.description


def _without_unit_dims(
    spec: Spec, module: ModuleType, graphs: list[OpGraph], arg_shapes: list[list[tuple[int, ...] | None]]
) -> list[OpGraph]:
    """`graphs`, each shape whose inputs have a dim of size 1 (a batch of one) traced again with
    those dims 2: a unit dim is dropped or viewed away in tracing (`aten_unit`, `out_view`), so a
    batch of one maps to another graph than a batch of four, where the generated wrapper takes its
    sizes from the tensors at each call and the larger graph computes the smaller case too (the
    harness checks every shape). The retraced graph keeps the real trace's sizes (rows, cols) where
    its stages line up with it. Unchanged where no shape without unit dims is there to match."""
    has_unit = [any(1 in shape for shape in shapes if shape is not None) for shapes in arg_shapes]
    if all(has_unit) or not any(has_unit):
        return graphs
    out = []
    for shape, g, unit in zip(spec.shapes, graphs, has_unit, strict=True):
        if not unit:
            out.append(g)
            continue
        grown, _ = _trace_shape(spec, module, shape, grow_units=True)
        if len(grown.stages) == len(g.stages):
            for mine, real in zip([grown, *grown.stages], [g, *g.stages], strict=True):
                for attr in ("rows", "cols", "inner", "batch"):
                    setattr(mine, attr, dict(getattr(real, attr)))
        out.append(grown)
    return out


def _structure(g: OpGraph) -> tuple[Any, ...]:
    stages = tuple(_structure(s) for s in g.stages)
    return (
        g.pattern,
        g.tensors,
        g.ops,
        g.outputs,
        g.dtype,
        g.gemm,
        g.conv,
        g.pool,
        g.reduce,
        g.out_view,
        g.forward_args,
        stages,
    )


# --- tracing --------------------------------------------------------------------------------------


# One trace at a time in this process: torch.fx keeps its tracing state in globals (a bench stages
# specs from several threads; level 1's 36_RMSNorm failed beside the others with "CURRENT_PATCHER is
# None in finally block").
_TRACING = threading.Lock()


def _trace_shape(
    spec: Spec, module: ModuleType, shape: ShapeSpec, grow_units: bool = False
) -> tuple[OpGraph, list[tuple[int, ...] | None]]:
    """The graph at one shape, and the forward's positional arguments' shapes (None: not a tensor);
    with `grow_units`, traced with the inputs' dims of size 1 made 2 (`_without_unit_dims`)."""
    import torch
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        torch.manual_seed(0)
        inputs = call_get_inputs(spec, module, shape)
        model = module.Model(*call_get_init_inputs(spec, module, shape))
    if spec.dtype is not None:
        model = model.to(getattr(torch, spec.dtype))
        inputs = [
            x.to(getattr(torch, spec.dtype)) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in inputs
        ]
    shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
    if grow_units:
        inputs = [
            x.new_empty([2 if d == 1 else d for d in x.shape]) if isinstance(x, torch.Tensor) else x
            for x in inputs
        ]
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)
    tensor_idx = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]

    def run(*flat: Any) -> Any:
        args = list(inputs)
        for j, i in enumerate(tensor_idx):
            args[i] = flat[len(names) + j]
        with _refusing_recurrent():
            return torch.func.functional_call(
                model, dict(zip(names, flat[: len(names)], strict=False)), tuple(args)
            )

    table = core_aten_decompositions()
    aten = torch.ops.aten
    for keep in (aten.silu.default, aten.silu_.default, aten.logsumexp.default):
        table.pop(keep, None)  # mapped whole: the decompositions bring ops the IR does not have
    flat = [state[n] for n in names] + [inputs[i] for i in tensor_idx]
    with _TRACING:
        gm = make_fx(
            torch.func.functionalize(run),
            decomposition_table=dict(table),
            tracing_mode="fake",
            _allow_non_fake_inputs=True,
        )(*flat)  # the forward's constants (torch.tensor(c))

    drop_unit_reductions(gm)  # reductions over size-1 dims are copies (`aten_unit`)
    split_merged_reductions(gm)  # over merged dims: over the dims merged (`aten_merge`)
    rewrite_attention(gm)  # SDPA's scaled operands and softmax guard, as the stages map them
    sources = [f"param:{n}" for n in names] + [f"input:{i}" for i in tensor_idx]
    forward_args = _forward_args(module.Model, len(inputs))
    return map_graph(gm, sources, forward_args, shape.name, mapper=mapper_for), shapes


# Recurrent layers decompose into one cell per step and layer (level 3's 6-layer LSTM over 512 steps:
# 3072 cells, minutes of tracing on a loaded host, while the bench's other runs wait for the
# templates' lock); no template covers them, so tracing stops where one is called.
RECURRENT = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})


def _refusing_recurrent() -> Any:
    """A torch function mode that raises `Unsupported` where a recurrent layer is called."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Refuse(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            if name in RECURRENT:
                raise Unsupported(f"aten.{name} (a recurrent layer) is not templated")
            if func is torch.tensor and isinstance(args[0] if args else None, int | float | bool):
                # A constant made in the forward: kept on the CPU, so the trace holds its value
                # (a get_attr node; on the inputs' meta device it would have none).
                kwargs = {k: v for k, v in (kwargs or {}).items() if k != "device"}
            return func(*args, **(kwargs or {}))

    return Refuse()


def _forward_args(model_cls: Any, n_inputs: int) -> list[str]:
    params = list(inspect.signature(model_cls.forward).parameters.values())[1:]
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(named) < n_inputs:
        return [f"arg{i}" for i in range(n_inputs)]
    return named[:n_inputs]


# --- the constructor ------------------------------------------------------------------------------

_CANONICAL_MODULES = {"torch": "torch", "torch.nn": "nn", "torch.nn.functional": "nn.functional",
                      "torch.nn.init": "nn.init", "math": "math"}  # fmt: skip


def _init_source(module: ModuleType) -> str:
    """`Model.__init__` as ModelNew's: same signature, `super()` bare, names that the candidate file
    does not define rewritten to `torch.`, `nn.` or `math.` paths or inlined as literals."""
    init = module.Model.__dict__.get("__init__")
    if init is None:
        return "def __init__(self):\n    super().__init__()\n"
    tree = pyast.parse(textwrap.dedent(inspect.getsource(init)))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.decorator_list = []
    local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    class Rewrite(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            if isinstance(node.func, ast.Name) and node.func.id == "super":
                node.args = []
            self.generic_visit(node)
            return node

        def visit_Name(self, node: ast.Name) -> ast.AST:
            if not isinstance(node.ctx, ast.Load) or node.id in local or node.id == "super":
                return node
            if node.id == "Model":
                raise Unsupported("Model.__init__ refers to `Model` other than in super(Model, self)")
            if node.id in vars(builtins) and node.id not in vars(module):
                return node
            if node.id not in vars(module):
                raise Unsupported(f"Model.__init__ uses the undefined name {node.id!r}")
            return pyast.parse_expression(_portable(node.id, vars(module)[node.id])).body

    fn = Rewrite().visit(fn)
    return ast.unparse(fn) + "\n"


def _portable(name: str, value: Any) -> str:
    import torch

    if inspect.ismodule(value):
        if value.__name__ in _CANONICAL_MODULES:
            return _CANONICAL_MODULES[value.__name__]
        raise Unsupported(
            f"Model.__init__ uses the module {value.__name__}; only torch, nn and math are kept"
        )
    for prefix, mod in (("nn.", torch.nn), ("torch.", torch), ("math.", math)):
        if getattr(mod, name, None) is value:
            return prefix + name
    if isinstance(value, bool | int | float | str | tuple | type(None)):
        try:
            text = repr(value)
            if pyast.literal_eval(text) == value:
                return text
        except (ValueError, SyntaxError):
            pass
    raise Unsupported(
        f"Model.__init__ uses {name!r}, defined in the spec; a generated candidate cannot carry it "
        "(inline it, or write a candidate by hand)"
    )


__all__ = ["Unsupported", "describe", "recognize"]
