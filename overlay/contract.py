"""The upstream contract: the upstream names our modules (src/vllm/) rely on.

Hooks are checked by the patches applying with zero fuzz; our modules reach
into upstream differently, by name: the model runner's attributes and private
methods, the scheduler's and the input batch's fields, the classes they
import. A rename upstream would only show as a failing test. So the names are
declared in ``contract.toml`` beside the series and checked against a tree
(``check`` on the patched pin, ``rebase`` on the rebased branch):

- ``[classes."<file>:<Class>"] names = [...]``: each name is defined in the
  class (a method, a class-level field, or ``self.<name> = ...`` in a method);
  with ``fields = "exact"`` the class's own fields must be those names, no
  more (a class our modules build by keyword would break on a new field);
- every ``from vllm.x import Name`` in our modules names something module
  ``vllm.x`` of the tree defines at top level (no declaration needed).

``receivers`` maps a variable name our modules use for an upstream object
(``runner``, ``scheduler``, ...) to its class, so ``undeclared`` can find an
attribute our code reads that the contract does not list.

``[families.<name>]`` groups the modules that serve one upstream runner:
``serves`` names that runner's file and ``modules`` our files for it (src/
paths; one ending in ``/`` is a folder and names every file under it). A
family is laid into a tree only where its ``serves`` file exists, so one
src/ serves releases with different runners (Model Runner V1 up to vLLM 0.33.0,
Model Runner V2 from 0.34.0 on); a class entry with ``family = "<name>"`` is
checked only where that family is laid.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from overlay.errors import InputError
from overlay.gitcmd import git
from overlay.modules import Module

CONTRACT_FILE = "contract.toml"
Reader = Callable[[str], str | None]  # tree path -> file text, None where the tree lacks it


@dataclass(frozen=True)
class Family:
    name: str
    serves: str  # the upstream file of the runner these modules serve
    modules: tuple[str, ...]  # our files, as paths under src/; "dir/" holds the files under it

    def holds(self, path: str) -> bool:
        """Whether our file at ``path`` (under src/) belongs to this family."""
        return any(path == entry or (entry.endswith("/") and path.startswith(entry)) for entry in self.modules)


@dataclass(frozen=True)
class Contract:
    classes: dict[str, tuple[str, ...]]  # "file:Class" -> names
    receivers: dict[str, str]  # variable name -> "file:Class"
    exact: frozenset[str] = frozenset()  # classes whose fields must be exactly their names
    families: tuple[Family, ...] = ()
    class_family: dict[str, str] = field(default_factory=dict)  # "file:Class" -> family name
    # "file:Class" -> family name -> names only that family's modules use (checked where it is laid)
    family_names: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)

    def absent(self, read: Reader) -> tuple[Family, ...]:
        """The families whose runner ``read``'s tree lacks."""
        return tuple(f for f in self.families if read(f.serves) is None)


def load(path: Path) -> Contract | None:
    """The contract beside the series, or None where there is none."""
    if not path.exists():
        return None
    try:
        data = tomllib.loads(path.read_text())
        classes = {key: tuple(entry["names"]) for key, entry in data.get("classes", {}).items()}
        receivers = dict(data.get("receivers", {}))
        exact = frozenset(key for key, entry in data.get("classes", {}).items() if entry.get("fields") == "exact")
        class_family = {key: entry["family"] for key, entry in data.get("classes", {}).items() if "family" in entry}
        family_names = {key: {fam: tuple(names) for fam, names in entry["family_names"].items()}
                        for key, entry in data.get("classes", {}).items() if "family_names" in entry}  # fmt: skip
        families = tuple(Family(name, entry["serves"], tuple(entry["modules"]))
                         for name, entry in data.get("families", {}).items())  # fmt: skip
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a valid contract: {e}") from None
    for key in [*classes, *receivers.values()]:
        if ":" not in key:
            raise InputError(f"{path}: {key!r} should read '<file>:<Class>'")
    unknown = sorted(set(receivers.values()) - set(classes))
    if unknown:
        raise InputError(f"{path}: receivers name classes with no [classes] entry: {', '.join(unknown)}")
    named = {*class_family.values(), *(fam for by_family in family_names.values() for fam in by_family)}
    if stray := sorted(named - {f.name for f in families}):
        raise InputError(f"{path}: classes name families with no [families] entry: {', '.join(stray)}")
    return Contract(classes, receivers, exact, families, class_family, family_names)


def problems(contract: Contract, modules: Iterable[Module], read: Reader) -> list[str]:
    """What of the contract ``read``'s tree breaks: one line per missing name, upstream-style."""
    read = functools.cache(read)  # several classes and imports name one file
    modules = tuple(modules)
    absent = {f.name for f in contract.absent(read)}
    found = []
    for key, names in contract.classes.items():
        if contract.class_family.get(key) in absent:
            continue  # a runner this tree does not have: its modules are not laid in
        for family, family_only in contract.family_names.get(key, {}).items():
            names += () if family in absent else family_only
        file, cls = key.split(":")
        node = _class_def(read(file), cls)
        if node is None:
            found.append(f"{file}: class {cls} is gone (our modules use {', '.join(names)})")
            continue
        defined = _class_names(node)
        found += [f"{file}: {cls}.{name} is gone" for name in names if name not in defined]
        if key in contract.exact and (new := sorted(_fields(node) - set(names))):
            found.append(f"{file}: {cls} has new fields {', '.join(new)} (our modules build it by keyword)")
    ours = {m.path for m in modules}
    for module in modules:
        for source, name, line in _vllm_imports(module):
            file = _module_file(source, read, ours)
            if file is None:
                found.append(f"{module.path}:{line}: imports {source}, which is gone")
            elif name and file not in ours and not _provides(file, source, name, read, ours):
                found.append(f"{module.path}:{line}: imports {name} from {source}, which no longer defines it")
    return found


def check_tree(series_path: Path, modules: Iterable[Module], repo: Path, tree: str) -> list[str]:
    """``problems`` of the contract beside ``series_path`` in git tree-ish ``tree`` of ``repo``."""
    contract = load(series_path.parent / CONTRACT_FILE)
    if contract is None:
        return []
    return problems(contract, modules, tree_reader(repo, tree))


def tree_reader(repo: Path, tree: str) -> Reader:
    """A Reader of git tree-ish ``tree`` in ``repo``."""

    def read(path: str) -> str | None:
        proc = git(repo, "cat-file", "blob", f"{tree}:{path}", check=False)
        return proc.stdout if proc.returncode == 0 else None

    return read


def undeclared(contract: Contract, modules: Iterable[Module]) -> list[str]:
    """Attributes our modules read on a receiver (``runner.x``) that its class's entry does not list."""
    missing = []
    for module in filter(_is_vllm_python, modules):
        for node in ast.walk(ast.parse(module.data)):
            receiver = _receiver(node.value) if isinstance(node, ast.Attribute) else None
            key = contract.receivers.get(receiver)
            family_only = (n for names in contract.family_names.get(key, {}).values() for n in names)
            if key and node.attr not in (*contract.classes[key], *family_only):
                missing.append(f"{module.path}:{node.lineno}: {receiver}.{node.attr} ({key})")
    return sorted(set(missing))


def _receiver(node: ast.expr) -> str | None:
    """'runner' for ``runner`` and ``self.runner``: the last name of a receiver expression."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _is_vllm_python(module: Module) -> bool:
    return module.path.endswith(".py") and module.path.startswith("vllm/")


def _class_def(source: str | None, cls: str) -> ast.ClassDef | None:
    if source is None:
        return None
    return next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls), None)


def _class_names(node: ast.ClassDef) -> set[str]:
    """Methods, class-level names and ``self.<name> = ...`` assignments of a class."""
    names = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(item.name)
        names |= _assigned(item)
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
            if isinstance(inner.value, ast.Name) and inner.value.id == "self":
                names.add(inner.attr)
    return names


def _fields(node: ast.ClassDef) -> set[str]:
    """The annotated class-level names of a class (dataclass and NamedTuple fields)."""
    return {i.target.id for i in node.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)}


def _assigned(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _top_level_names(source: str) -> set[str]:
    return _defined(ast.parse(source).body)


def _defined(body: list[ast.stmt]) -> set[str]:
    """Names a module body defines, inside ``if TYPE_CHECKING:`` / ``try:`` blocks too."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If):
            names |= _defined(node.body) | _defined(node.orelse)
        elif isinstance(node, ast.Try):
            names |= _defined(node.body) | _defined(node.orelse) | _defined(node.finalbody)
            for handler in node.handlers:
                names |= _defined(handler.body)
        else:
            names |= _assigned(node)
    return names


def _vllm_imports(module: Module) -> list[tuple[str, str, int]]:
    """(module, name, line) for each ``from vllm... import name`` in a Python module of ours."""
    if not _is_vllm_python(module):
        return []
    found = []
    for node in ast.walk(ast.parse(module.data)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            found += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "vllm"]
    return [(source, name, line) for source, name, line in found if name != "*"]


def _provides(file: str, source: str, name: str, read: Reader, ours: set[str]) -> bool:
    """Module ``source`` (in ``file``) defines ``name``, or has a submodule of that name."""
    return name in _top_level_names(read(file) or "") or _module_file(f"{source}.{name}", read, ours) is not None


def _module_file(source: str, read: Reader, ours: set[str]) -> str | None:
    base = source.replace(".", "/")
    for file in (f"{base}.py", f"{base}/__init__.py"):
        if file in ours or read(file) is not None:
            return file
    return None
