"""The package's import graph, read from the source as text (nothing imported): import circles and
private names taken from another module. Every import counts, a function's own included, since a
deferred import still ties the two modules together.

The circles and private imports that exist today are listed here, so that none is added unnoticed
and each one removed is struck off the list (the test fails both ways): the list only shrinks."""
import ast
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {"fastbert": "fastbert", "fastbert.kernels": "kernels"}  # package -> folder (setup.py's package_dir)

# the package's layers, lowest first: a module imports from its own layer and the layers below it,
# never from one above (the package's __init__, which gathers the public names, stands above them all)
LAYERS = [
    ("foundations", ["fastbert.backend", "fastbert.dtypes", "fastbert.files", "fastbert.memory", "fastbert.layouts",
                     "fastbert.reference", "fastbert.kernels"]),
    ("ops", ["fastbert.ops", "fastbert.masking"]),
    ("models and data", ["fastbert.model", "fastbert.data", "fastbert.plotting"]),
    ("what is built on the models", ["fastbert.hf", "fastbert.sentence", "fastbert.token_outputs",
                                     "fastbert.cross_encoder", "fastbert.attention_maps", "fastbert.pretraining",
                                     "fastbert.selfcheck"]),
    ("services", ["fastbert.serve", "fastbert.corpus_embedding", "fastbert.ray", "fastbert.bench"]),
    ("the command line", ["fastbert.commands", "fastbert.cli", "fastbert.__main__"]),
]

def module_files() -> dict:
    """Every module of the package: its dotted name -> its file."""
    out = {}
    for package, folder in SOURCES.items():
        base = os.path.join(ROOT, folder)
        for here, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            rel = os.path.relpath(here, base)
            prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            if "__init__.py" not in files:
                continue
            for name in sorted(files):
                if name.endswith(".py"):
                    out[prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"] = os.path.join(here, name)
    return out


def imports(modules: dict) -> dict:
    """module -> {module it imports: [names it takes from it]} (an empty list: the module itself,
    imported whole)."""
    graph = {}
    for name, path in modules.items():
        is_package = path.endswith("__init__.py")
        edges = defaultdict(list)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        edges[alias.name]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    source = ".".join(parts + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        edges[f"{source}.{alias.name}"]
                    elif source in modules:
                        edges[source].append(alias.name)
        # a module's own package and the packages above it are being imported already when it runs:
        # taking a name from one of them (fastbert._C, the extension) ties nothing new
        graph[name] = {m: names for m, names in edges.items() if m != name and not name.startswith(m + ".")}
    return graph


def circles(graph: dict) -> set:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], set(), [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def private_imports(graph: dict) -> list:
    """(module, the module it takes from, name) for each private name (one underscore, not a dunder)
    that a module takes from another."""
    return sorted((a, b, n) for a, edges in graph.items() for b, names in edges.items()
                  for n in names if n.startswith("_") and not n.startswith("__"))


GRAPH = imports(module_files())


def test_the_graph_is_read():
    # the reader finds the imports it must: a test that could not fail would prove nothing
    assert "fastbert.ops.gemm" in GRAPH["fastbert.ops.int8"]
    assert "fastbert.kernels.attention.common" in GRAPH["fastbert.kernels.attention.forward"]  # `from .common`
    assert "dropout_threshold" in GRAPH["fastbert.kernels"]["fastbert.reference"]  # `from ..reference`, in a function
    assert "fastbert.ray" in GRAPH["fastbert.commands.embed"]  # inside a function
    assert "embed_files" in GRAPH["fastbert.commands.embed"]["fastbert.ray"]
    assert circles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == {frozenset("abc")}


def test_no_import_circle():
    found = circles(GRAPH)
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_no_library_module_imports_the_command_line():
    # the commands sit above everything they call: fastbert.cli and fastbert.commands import the
    # library, never the other way round
    def is_command_line(module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in ("fastbert.cli", "fastbert.commands",
                                                                          "fastbert.__main__"))

    above = [(a, b) for a, edges in GRAPH.items() if not is_command_line(a) for b in edges if is_command_line(b)]
    assert not above, "\n".join(f"{a} imports {b}" for a, b in above)


def test_no_module_takes_a_private_name_from_another():
    # a name two modules share is public, or lives where both reach it
    found = private_imports(GRAPH)
    assert not found, "\n".join(f"{a} takes {n} from {b}" for a, b, n in found)


# Names with a leading underscore that are not fastbert's own: transformers' hook a fastbert model
# overrides under transformers' name, and a namedtuple's methods. (torch's and transformers' own
# modules are passed over whole: see fastbert_name.)
NOT_FASTBERTS = {"_init_weights", "_replace", "_fields", "_asdict", "_make", "_field_defaults"}
FOREIGN = {"torch", "transformers"}  # a fastbert module's attribute that is one of these is not fastbert's


def is_private(name: str) -> bool:
    """A private name of fastbert: one leading underscore (not a dunder), not the extension modules
    (fastbert._C, fastbert._kernels_<level>) and not in NOT_FASTBERTS."""
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_C"
            and not name.startswith("_kernels_") and name not in NOT_FASTBERTS)


def is_fastbert(dotted: str) -> bool:
    return dotted == "fastbert" or dotted.startswith("fastbert.")


def private_reaches(source: str, path: str = "<test>") -> list:
    """(line, dotted name) for each private name of fastbert that a test module's source takes:
    `from fastbert.x import _y`, an attribute `fastbert.x._y` or `m._y` (m a name bound to something of
    fastbert's: by an import, `m = fastbert.x`, or `m = pytest.importorskip("fastbert.x")`), and
    `setattr / getattr / hasattr / delattr(m, "_y", ...)` (monkeypatch's among them) or a patch target
    string "fastbert.x._y"."""
    tree = ast.parse(source, path)
    bound, found = {}, []

    def fastbert_name(node):
        """The dotted name `node` stands for when it is a name bound to fastbert or an attribute chain
        on one (and passes no FOREIGN module), else None."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in bound or FOREIGN & set(attrs):
            return None
        return ".".join([bound[node.id], *reversed(attrs)])

    def module_named(node):
        """The fastbert module an importorskip / import_module call imports, else None."""
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and is_fastbert(node.args[0].value)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("importorskip", "import_module")):
            return node.args[0].value
        return None

    for node in ast.walk(tree):  # the imports first: a name is bound wherever the module binds it
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_fastbert(alias.name):
                    bound[alias.asname or "fastbert"] = alias.name if alias.asname else "fastbert"
        elif isinstance(node, ast.ImportFrom) and not node.level and is_fastbert(node.module or ""):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if is_private(alias.name):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
    for node in ast.walk(tree):  # then the names assigned a fastbert module
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            dotted = module_named(node.value) or fastbert_name(node.value)
            if dotted is not None and is_fastbert(dotted):
                bound[node.targets[0].id] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = fastbert_name(node.value)
            if owner is not None and is_fastbert(owner):
                found.append((node.lineno, f"{owner}.{node.attr}"))
        elif isinstance(node, ast.Call) and node.args:
            called = getattr(node.func, "attr", getattr(node.func, "id", None))
            first = node.args[0]
            if called in ("setattr", "getattr", "hasattr", "delattr") and len(node.args) > 1:
                owner, name = fastbert_name(first), node.args[1]
                if (owner is not None and is_fastbert(owner) and isinstance(name, ast.Constant)
                        and isinstance(name.value, str) and is_private(name.value)):
                    found.append((node.lineno, f"{owner}.{name.value}"))
            if (called in ("setattr", "delattr", "patch") and isinstance(first, ast.Constant)
                    and isinstance(first.value, str) and is_fastbert(first.value)
                    and any(is_private(part) for part in first.value.split("."))):
                found.append((node.lineno, first.value))
    return sorted(set(found))


def test_the_tests_reader_finds_private_names():
    source = """if True:
        import fastbert
        import fastbert.ops.gemm as g
        from fastbert.ops import gemm
        from fastbert.ray import _node_cpus, Pool
        from fastbert.kernels.report import _picks
        import torch
        m = fastbert.plotting
        r = pytest.importorskip("fastbert.ray")
        gemm._RUN
        g._call(1)
        fastbert.ray._Embedder
        monkeypatch.setattr(m, "_found", [None])
        monkeypatch.setitem(gemm._RUN, "onednn", None)
        monkeypatch.setattr("fastbert.ray._node_cpus", list)
        r._sizes
        Pool(1, 2, 3)._replace(min_size=2)._fields
        fastbert._C.mask_tokens, fastbert.backend._kernels_avx2, gemm.torch._int_mm, torch._C
        fastbert.kernels._x, gemm.__doc__
        monkeypatch.setattr(gemm, "product", None)
        """
    assert private_reaches(source) == [
        (5, "fastbert.ray._node_cpus"), (6, "fastbert.kernels.report._picks"), (10, "fastbert.ops.gemm._RUN"),
        (11, "fastbert.ops.gemm._call"), (12, "fastbert.ray._Embedder"), (13, "fastbert.plotting._found"),
        (14, "fastbert.ops.gemm._RUN"), (15, "fastbert.ray._node_cpus"), (16, "fastbert.ray._sizes"),
        (19, "fastbert.kernels._x")]


def test_tests_use_public_names_only():
    """A test goes through what the module offers its users: a private name it reaches is made
    public where it is part of the module's interface, or the test goes through a public hook."""
    found = []
    for here, dirs, files in os.walk(os.path.join(ROOT, "tests")):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(here, name)
                with open(path, encoding="utf-8") as f:
                    found += [f"{os.path.relpath(path, ROOT)}:{line}: {what}"
                              for line, what in private_reaches(f.read(), path)]
    assert not found, "tests reaching private names of fastbert:\n" + "\n".join(found)


def test_the_model_reaches_the_kernels_only_through_ops():
    """fastbert.model hands its layers' weights to fastbert.ops (fastbert.ops.encoder owns how they
    run); no model module calls the extension or imports a backend's kernels itself."""
    files = {name: path for name, path in module_files().items() if name.startswith("fastbert.model")}
    assert "fastbert.model.bert" in files
    for name, path in files.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        called |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not called & {"cpp_function", "cpp_extension", "_C"}, f"{name} calls the extension itself"
        assert not {m for m in GRAPH[name] if m.startswith(("fastbert.kernels", "fastbert._C"))}, \
            f"{name} imports kernels itself"


def layer_of(module: str):
    """The index in LAYERS of the layer that holds `module` (its longest matching prefix), or None."""
    found, longest = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > longest:
                found, longest = i, len(prefix)
    return found


def test_no_import_runs_back_up_the_layers():
    assert layer_of("fastbert.ops.encoder") == 1 and layer_of("fastbert.commands.embed") == 5
    unplaced = sorted(m for m in GRAPH if m != "fastbert" and layer_of(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS: place them: {unplaced}"
    up = sorted(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                for a, edges in GRAPH.items() if a != "fastbert" for b in edges
                if b != "fastbert" and layer_of(b) > layer_of(a))
    assert not up, "imports that run back up:\n" + "\n".join(up)
