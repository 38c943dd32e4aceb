"""Every lifecycle field has one writer (issue: one place writes runners and jobs).

The scan reads the production code's syntax trees and fails on any write of a lifecycle
field outside the one function that owns it: a queryset `update`/`create` naming the field
(directly, or through a dict splatted into the call), an attribute assignment, or a
`save(update_fields=...)` naming it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("accounts", "fleet", "runners", "zoomies_site", "capacity")
# Not Django code, or not this project's rows: the agent runs without Django, the fake
# GitHub keeps its own job records, the scheduler is pure.
# The fakes of outside services keep their own objects' states (a fake Proxmox task's
# status), not rows of ours.
SKIPPED = (
    "fleet/agent/",
    "runners/github/",
    "runners/scheduler/",
    "/migrations/",
    "fleet/providers/proxmox/fake.py",
)

# (model, field) -> the functions allowed to write it, as "path::function".
OWNERS: dict[tuple[str, str], set[str]] = {
    ("Runner", "state"): {
        "runners/transitions.py::transition_runner",
        # Issue 21 item 20: the one guarded edge off the allow-list (failed -> busy).
        "runners/transitions.py::revive_runner",
        # The birth of a runner row (create_runner and create_runners, one or a burst's group).
        "runners/actions/lifecycle.py::_write_runner",
        # Issue 28: runners a burst of webhooks moves, read and locked by their caller.
        "runners/transitions.py::transition_read_runners",
    },
    ("Job", "status"): {
        "runners/actions/jobs.py::record_job",
        # Issue 28: a burst's new queued jobs, inserted together (runners/webhooks.py).
        "runners/actions/jobs.py::record_new_queued_jobs",
        # Issue 28: a burst's in_progress and completed deliveries, moved together.
        "runners/actions/jobs.py::apply_job_moves_together",
    },
    ("Job", "fleet_failure"): {
        "runners/actions/steps.py::mark_fleet_failure",
        "runners/actions/steps.py::clear_fleet_failure",
    },
    ("AgentTask", "state"): {
        "fleet/transitions.py::transition_task",
        "fleet/taskqueue.py::enqueue_task",
        "fleet/taskqueue.py::enqueue_tasks",
        # Issue 28: a poll's take, one guarded UPDATE a task.
        "fleet/transitions.py::take_pending_tasks",
    },
    ("Machine", "state"): {"fleet/transitions.py::transition_machine"},
    # HOST-29: loans only rise, from the agent's heartbeat.
    ("Runner", "lent_memory_mb"): {"runners/host_facts.py::record_memory_loans"},
    ("Runner", "would_lend_memory_mb"): {"runners/host_facts.py::record_memory_loans"},
    ("Runner", "memory_blocked"): {"runners/host_facts.py::record_memory_blocked"},
    ("Host", "health"): {"fleet/transitions.py::transition_host_health"},
    # HOST-19: the throttle moves only by the controller's step, from the samples.
    ("Host", "throttle_level"): {"fleet/throttling.py::throttle_step"},
    # Issue 22 item 4: runners/actions/installations.py writes installations.
    ("Installation", "active"): {
        "runners/actions/installations.py::add_installation",
        "runners/actions/installations.py::remove_installation",
    },
    ("Installation", "repositories"): {
        "runners/actions/installations.py::add_installation",
        "runners/actions/installations.py::change_repositories",
    },
    ("Installation", "account"): {"runners/actions/installations.py::add_installation"},
    ("Installation", "standdown_until"): {
        "runners/actions/installations.py::stand_down_installation",
        "runners/actions/installations.py::clear_standdown",
    },
    ("Installation", "standdown_reason"): {
        "runners/actions/installations.py::stand_down_installation",
        "runners/actions/installations.py::clear_standdown",
    },
}
MODELS = {model for model, _ in OWNERS}
FIELDS = {field for _, field in OWNERS}
WRITE_METHODS = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}


@dataclass(frozen=True)
class Write:
    where: str  # path::function
    line: int
    model: str | None  # None when the queryset's model cannot be read from the call
    field: str

    def allowed(self) -> bool:
        owners = [
            owners for (model, field), owners in OWNERS.items() if field == self.field
            if self.model is None or model == self.model
        ]  # fmt: skip
        # Unknown model: the write must sit in a function that owns the field for some model.
        return any(self.where in o for o in owners)

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: writes {self.model or '?'}.{self.field}"


def _root_name(node: ast.AST) -> str | None:
    """`Runner.objects.filter(...).update` -> "Runner"."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _resolve_root(func: ast.AST | None, name: str | None, depth: int = 0) -> str | None:
    """Follow `query = Model.objects.filter(...)` back to "Model" within the function."""
    if func is None or name is None or depth > 4 or name[:1].isupper():
        return name
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            root = _root_name(node.value)
            if root is not None and root != name:
                return _resolve_root(func, root, depth + 1)
    return name


def _const_keys(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {k.arg for k in node.keywords if k.arg}
    return set()


def _dict_keys(func: ast.AST, name: str) -> set[str]:
    """Every key the function puts in the local dict `name`."""
    keys: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name and node.value:
                    keys |= _const_keys(node.value)
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == name
                    and isinstance(target.slice, ast.Constant)
                ):
                    keys.add(target.slice.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
            and node.func.attr in ("update", "setdefault")
        ):
            keys |= {k.arg for k in node.keywords if k.arg}
            for arg in node.args:
                keys |= _const_keys(arg)
            if node.func.attr == "setdefault" and node.args:
                if isinstance(node.args[0], ast.Constant):
                    keys.add(node.args[0].value)
    return keys


def _is_local_dict(func: ast.AST | None, name: str) -> bool:
    """Whether the function binds `name` to a dict literal (so `name.update` builds a dict)."""
    if func is None:
        return False
    for node in ast.walk(func):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                value = node.value
                if isinstance(value, ast.Dict) or (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id == "dict"
                ):
                    return True
    return False


def _is_model_class(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Attribute) and b.attr == "Model")
        or (isinstance(b, ast.Name) and b.id == "Model")
        for b in node.bases
    )


def writes_in(source: str, path: str) -> list[Write]:
    """Every write of a lifecycle field in `source` (a module at `path`)."""
    tree = ast.parse(source)
    found: list[Write] = []

    def visit(node: ast.AST, func: ast.AST | None, where: str, model_class: bool) -> None:
        if isinstance(node, ast.ClassDef):
            model_class = _is_model_class(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func, where = node, f"{path}::{node.name}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            root = _resolve_root(func, _root_name(node.func.value))
            model = root if root in MODELS else None
            other_model = model is None and root is not None and root[:1].isupper()
            names: set[str] = set()
            if method in WRITE_METHODS:
                for kw in node.keywords:
                    if kw.arg == "defaults":
                        names |= _const_keys(kw.value)
                    elif kw.arg is not None:
                        names.add(kw.arg)
                    elif isinstance(kw.value, ast.Name) and func is not None:
                        names |= _dict_keys(func, kw.value.id)
                    else:
                        names |= _const_keys(kw.value)
                if method == "bulk_update":
                    for arg in node.args[1:]:
                        if isinstance(arg, ast.List | ast.Tuple):
                            names |= {e.value for e in arg.elts if isinstance(e, ast.Constant)}
            if method == "save":
                for kw in node.keywords:
                    if kw.arg == "update_fields" and isinstance(kw.value, ast.List | ast.Tuple):
                        names |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
            if (
                method in ("update", "setdefault")
                and isinstance(node.func.value, ast.Name)
                and _is_local_dict(func, node.func.value.id)
            ):
                # `fields.update(state=...)`: a dict being built, judged where it is splatted.
                names = set()
            if other_model:
                names = set()  # another app's model (a capacity Attempt's state)
            for name in names & FIELDS:
                found.append(Write(where, node.lineno, model, name))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in MODELS
        ):
            # A row built to be inserted (`Job(status=...)` for a bulk_create) is a write by
            # whoever builds it.
            for kw in node.keywords:
                if kw.arg in FIELDS:
                    found.append(Write(where, node.lineno, node.func.id, kw.arg))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not (isinstance(target, ast.Attribute) and target.attr in FIELDS):
                    continue
                on_self = isinstance(target.value, ast.Name) and target.value.id == "self"
                if on_self and not model_class:
                    continue  # an attribute of some other object (an error's HTTP status)
                found.append(Write(where, node.lineno, None, target.attr))
        for child in ast.iter_child_nodes(node):
            visit(child, func, where, model_class)

    visit(tree, None, f"{path}::<module>", False)
    return found


def production_files() -> list[tuple[str, Path]]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(skip in f"/{rel}" for skip in SKIPPED):
                files.append((rel, path))
    return files


def test_every_lifecycle_field_is_written_only_by_its_one_function():
    """Runner.state, Job.status and fleet_failure, AgentTask.state, Machine.state,
    Host.health and the Installation stand-down: a write anywhere else fails this test."""
    stray = [
        str(w)
        for rel, path in production_files()
        for w in writes_in(path.read_text(), rel)
        if not w.allowed()
    ]
    assert stray == [], "lifecycle fields written outside their one function:\n" + "\n".join(stray)


def test_each_owner_really_writes_its_field():
    """The allow-list names real functions: an owner that moved or was renamed is caught."""
    seen = {
        w.where
        for rel, path in production_files()
        for w in writes_in(path.read_text(), rel)
    }  # fmt: skip
    missing = sorted({o for owners in OWNERS.values() for o in owners} - seen)
    assert missing == []


def test_the_scan_finds_every_shape_of_direct_write():
    """The scan is not vacuous: each way of writing a field outside its owner is flagged."""
    source = """
def sneaky(runner, job, host, pk, installation):
    Runner.objects.filter(pk=pk).update(state="busy")
    Job.objects.filter(pk=pk).update(fleet_failure="x")
    fields = {"status": "completed"}
    Job.objects.filter(pk=pk).update(**fields)
    extra = {}
    extra["health"] = "lost"
    Host.objects.filter(pk=pk).update(**extra)
    runner.tasks.filter(kind="create_runner").update(state="cancelled")
    installation.standdown_until = None
    job.save(update_fields=["status"])
    AgentTask.objects.create(state="pending")
    query = Runner.objects.filter(pk=pk)
    query.update(state="failed")
    Attempt.objects.filter(pk=pk).update(state="sending")
    Job.objects.bulk_create([Job(status="queued")])
"""
    flagged = [w for w in writes_in(source, "x.py") if not w.allowed()]
    assert [(w.line, w.model, w.field) for w in flagged] == [
        (3, "Runner", "state"),
        (4, "Job", "fleet_failure"),
        (6, "Job", "status"),
        (9, "Host", "health"),
        (10, None, "state"),
        (11, None, "standdown_until"),
        (12, None, "status"),
        (13, "AgentTask", "state"),
        (15, "Runner", "state"),
        (17, "Job", "status"),
    ]
