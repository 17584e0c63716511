"""The functions of ``to_source``: one per torch class, its instances' differences as arguments.

Each instance of a user's class is described by its children (``Leaf`` layers with their
non-default constructor arguments, ``Container``s, ``TensorSpec`` parameters and buffers,
other instances, ``None``) and its forward's statements. ``ClassWriter`` unifies the
instances of a class: values that differ become arguments (``Arg``), named after the
constructor argument they first fill (``out_channels``, ``stride``) or, for a parameter's
dimension, the torch attribute holding it (``num_heads``), never like a name the forward
reads or binds, and shared wherever two places hold the same value in every instance; a child whose structure differs (an optional
``downsample``) becomes an argument itself. Instances whose forwards differ are one function
when an optional child (``if self.downsample is not None:``) or an attribute of the torch
module (``if use_res_connect:``) tells the forms apart; otherwise they are written as
separate functions, with a comment saying so.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import Counter

from funcnet import nn
from funcnet.interop.source.forward import RESERVED
from funcnet.interop.source.modes import branch, masked, parameterized
from funcnet.interop.source.specs import (
    _NO_DEFAULT,
    Arg,
    Call,
    Container,
    Later,
    Leaf,
    TensorSpec,
    _call,
    _has_later,
    _is_literal,
    _Dict,
    _Raw,
    _same,
    keyword_parts,
)
from funcnet.interop.source.text import child_expr, literal


class ClassWriter:
    """The function of each class, and the call that builds each instance."""

    def __init__(self, specs: dict, classes: dict, order: list, width: int, names: dict):
        self.specs, self.classes, self.order, self.width = specs, classes, order, width
        self.names = names  # id(module) -> its dotted path
        self.where = None  # (path, class name) of the class being written, for error messages
        self.calls: dict = {}  # id(instance) -> Call
        self.texts: list = []  # function sources, children first
        self.done: set = set()
        self.used_names: set = set(RESERVED)
        self.later: dict = {}  # id(instance) -> Later, for instances met inside their own class's function

    def resolve(self, spec):
        """The source expression of ``spec``: an instance's constructor call (writing its class first) or the spec
        itself."""
        if isinstance(spec, tuple) and spec[:1] == ("instance",):
            if spec[1] not in self.calls:
                cls = next(c for c, ms in self.classes.items() if any(id(m) == spec[1] for m in ms))
                self.write_class(cls)
            if spec[1] not in self.calls:  # its class is being written: a tree of that class
                return self.later.setdefault(spec[1], Later(spec[1]))
            return self.calls[spec[1]]
        if isinstance(spec, Leaf):
            return Leaf(spec.factory, tuple((n, self.resolve(v)) for n, v in spec.args))
        if isinstance(spec, Container):
            return Container(spec.kind, tuple((n, self.resolve(v)) for n, v in spec.items))
        return spec

    def functions(self, root, ties: dict) -> list:
        """Write every class's function (children first) for the model ``root`` and return their sources."""
        self.root, self.ties = root, ties
        for cls in self.order:
            self.write_class(cls)
        return self.texts

    def _fresh(self, name: str) -> str:
        out, k = name, 1
        while out in self.used_names:
            k += 1
            out = f"{name}_{k}"
        self.used_names.add(out)
        return out

    def write_class(self, cls) -> None:
        """Write the function of class ``cls`` once, after the classes it builds."""
        if cls in self.done:
            return
        self.done.add(cls)
        instances = self.classes[cls]
        outer, self.where = self.where, (self.names.get(id(instances[0]), "?"), cls.__name__)
        kids = {id(m): tuple((n, self.resolve(v)) for n, v in self.specs[id(m)][0]) for m in instances}
        _pad_none_children(instances, kids)
        parts = _partition(instances, kids, self.specs)
        comment = ""
        if len(parts) > 1:
            comment = (f"# {cls.__name__}'s instances trace to different forwards or children, so each form is "
                       f"its own function\n")
        for i, members in enumerate(parts):
            name = self._fresh(cls.__name__)
            self.texts.append((comment if i == 0 else "") + self._function(name, cls.__name__, members, kids))
        for m in instances:
            if id(m) in self.later:
                self.later[id(m)].call = self.calls[id(m)]
        self.where = outer  # kept where an error leaves, so that its message names the class

    def _function(self, name: str, torch_name: str, members: list, kids: dict) -> str:
        k = len(members)
        groups: list = []  # [name, values, kind]
        # the names the forwards read or bind (``size = (H // 7) * (W // 7)``, ``x``, ``jnp``): an argument named
        # like one would be shadowed inside ``forward`` or shadow what it reads
        local = set().union(*(_names_in(self.specs[id(m)][1], self.specs[id(m)][2]) for m in members))

        def arg_for(values: tuple, hint: str, kind: str, default=_NO_DEFAULT) -> Arg:
            for g in groups:
                if g[1] == values:
                    return Arg(g[0])
            if hint == "size" and kind == "value":  # a parameter's dimension: the attribute holding it (num_heads)
                hint = _attribute_with(members, values) or hint
            taken = {g[0] for g in groups} | local
            base = hint if hint.isidentifier() and hint not in RESERVED else f"{hint}_"
            if not base.isidentifier():
                base = "value"
            new, j = base, 1
            while new in taken:
                j += 1
                new = f"{base}_{j}"
            groups.append([new, values, kind, default])
            return Arg(new)

        def unify(values: tuple, hint: str, default=_NO_DEFAULT):
            if any(_has_later(v) for v in values):  # a subtree of this class: passed by the caller
                return arg_for(values, hint, "child")
            values = tuple(v.call if isinstance(v, Later) else v for v in values)
            first = values[0]
            if all(_same(v, first) or v == first for v in values):
                return first
            types = {type(v) for v in values}
            if types == {Leaf} and len({v.factory for v in values}) == 1:
                params = inspect.signature(getattr(nn, first.factory)).parameters
                names = list(dict.fromkeys(n for v in values for n, _ in v.args))
                names.sort(key=lambda n: list(params).index(n) if n in params else len(params))
                out = []
                for n in names:
                    default = params[n].default if n in params else None
                    vals = tuple(dict(v.args).get(n, default) for v in values)
                    out.append((n, unify(vals, n, default)))
                return Leaf(first.factory, tuple(out))
            if types == {TensorSpec} and len({(v.kind, v.dtype, len(v.shape)) for v in values}) == 1:
                shape = tuple(unify(tuple(v.shape[i] for v in values), "size") for i in range(len(first.shape)))
                return TensorSpec(first.kind, shape, first.dtype)
            if types == {Container} and len({(v.kind, tuple(n for n, _ in v.items)) for v in values}) == 1:
                return Container(first.kind, tuple((n, unify(tuple(dict(v.items)[n] for v in values),
                                                             hint if n.isdigit() else n)) for n, _ in first.items))
            if types == {Call} and len({(v.func, tuple(n for n, _ in v.args)) for v in values}) == 1:
                args = tuple((n, unify(tuple(dict(v.args)[n] for v in values), n)) for n, _ in first.args)
                return Call(first.func, args, first.keywords)
            if all(_is_literal(v) for v in values):
                return arg_for(values, hint, "value", default)
            return arg_for(values, hint, "child")

        names = [n for n, _ in kids[id(members[0])]]
        template = [(n, unify(tuple(dict(kids[id(m)])[n] for m in members), n)) for n in names]
        forwards = [self.specs[id(m)][1] for m in members]
        recorded = [f for f, m in zip(forwards, members) if not _unrecorded(f)]
        forms = list(dict.fromkeys(repr(f) for f in recorded)) or [repr(forwards[0])]
        sig = next((self.specs[id(m)][2] for m, f in zip(members, forwards) if not _unrecorded(f)),
                   self.specs[id(members[0])][2])
        if len(forms) == 1:
            stmts = recorded[0] if recorded else forwards[0]
        elif len({masked(f) for f in recorded}) == 1:  # only constants differ: they become arguments
            rec = [m for m, f in zip(members, forwards) if not _unrecorded(f)]
            if len(rec) < len(members):  # an instance never called takes the first recorded one's values
                rec = [m if not _unrecorded(f) else rec[0] for m, f in zip(members, forwards)]
            stmts = parameterized(rec, [self.specs[id(m)][1] for m in rec], arg_for)
        else:
            stmts = _branch_forms(members, forwards, template, arg_for, groups)
        # arguments: those whose most common value is in most instances get it as their default
        params, call_args = [], {id(m): [] for m in members}
        for g in groups:
            counts = Counter(repr(v) for v in g[1])
            common, c = counts.most_common(1)[0]
            default = _NO_DEFAULT
            if c * 2 > k and (common == "None" or (g[3] is not _NO_DEFAULT and repr(g[3]) == common)):
                default = next(v for v in g[1] if repr(v) == common)
            params.append((g[0], default, g[1]))
        params.sort(key=lambda p: p[1] is not _NO_DEFAULT)
        for i, m in enumerate(members):
            for pname, default, values in params:
                if default is _NO_DEFAULT or repr(values[i]) != repr(default):
                    call_args[id(m)].append((pname, values[i]))
            keywords = tuple(p for p, d, _ in params if d is not _NO_DEFAULT)
            self.calls[id(m)] = Call(name, tuple(call_args[id(m)]), keywords)
        head = ", ".join(p if d is _NO_DEFAULT else f"{p}={literal(d)}" for p, d, _ in params)
        lines = [f"def {name}({head}):", f"    def forward({sig}):"]
        lines += ["        " + line for s in stmts for line in s]
        parts = [(None, _Raw("forward"))] + ([("name", torch_name)] if name != torch_name else [])
        parts += keyword_parts(template)
        if any(m is getattr(self, "root", None) for m in members) and self.ties:
            parts.append(("tied", _Dict(tuple(self.ties.items()))))
        lines += ["", "    return " + _call("nn.Composite", parts, 11, self.width)]
        return "\n".join(lines) + "\n"


def _names_in(stmts: list, sig: str) -> set:
    """Every variable name a forward's statements and signature read or bind."""
    text = f"def forward({sig}):\n" + "\n".join("    " + line for s in stmts for line in s)
    try:
        tree = ast.parse(text)
    except SyntaxError:  # not expected of written statements; then every word counts as taken
        return set(re.findall(r"[A-Za-z_]\w*", text))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}


def _attribute_with(members: list, values: tuple) -> str | None:
    """The name of the torch modules' int attribute holding ``values`` (one per instance), if one does."""
    for name, v in vars(members[0]).items():
        if name.startswith("_") or not isinstance(v, int) or isinstance(v, bool) or not name.isidentifier():
            continue
        if tuple(getattr(m, name, None) for m in members) == values:
            return name
    return None


def _pad_none_children(instances, kids: dict) -> None:
    """``self.downsample = None`` is a plain attribute in torch, not a child: an instance that
    has None where another instance has a child gets ``downsample=None`` in the same place."""
    base = max((tuple(n for n, _ in kids[id(m)]) for m in instances), key=len)
    for m in instances:
        have = dict(kids[id(m)])
        missing = set(base) - set(have)
        if missing and all(getattr(m, n, 0) is None for n in missing) and [n for n in base if n in have] == \
                list(have):
            kids[id(m)] = tuple((n, have.get(n)) for n in base)


def _unrecorded(stmts) -> bool:
    return len(stmts) == 1 and stmts[0][0].startswith("raise NotImplementedError")


def _partition(instances, kids, specs) -> list:
    """Instances that can share one function: the same child names, and forwards that one
    condition can tell apart (checked when the function is written; here by child names)."""
    parts: dict = {}
    for m in instances:
        key = tuple(n for n, _ in kids[id(m)])
        parts.setdefault(key, []).append(m)
    out = []
    for members in parts.values():
        if _separable(members, kids, specs):
            out.append(members)
        else:
            by_form: dict = {}
            for m in members:  # an instance never called goes with the first form (its forward is unknown)
                if not _unrecorded(specs[id(m)][1]):
                    by_form.setdefault(masked(specs[id(m)][1]), []).append(m)
            groups = list(by_form.values()) or [[]]
            groups[0] += [m for m in members if _unrecorded(specs[id(m)][1])]
            out.extend(groups)
    return out


def _separable(members, kids, specs) -> bool:
    recorded = [specs[id(m)][1] for m in members if not _unrecorded(specs[id(m)][1])]
    if len({repr(f) for f in recorded}) <= 1 or len({masked(f) for f in recorded}) == 1:
        return True
    return _condition(members, kids, specs) is not None


def _condition(members, kids, specs):
    """How to tell the forms apart: ``("child", name)`` (None in exactly one form's instances)
    or ``("attr", name)`` (an attribute of the torch module with one value per form)."""
    form = [repr(specs[id(m)][1]) for m in members]
    forms = list(dict.fromkeys(form))
    if len(forms) == 2:
        for n, _ in kids[id(members[0])]:
            none = [dict(kids[id(m)])[n] is None for m in members]
            if any(none) and not all(none):
                with_none = {f for f, x in zip(form, none) if x}
                without = {f for f, x in zip(form, none) if not x}
                if len(with_none) == 1 and len(without) == 1 and with_none != without:
                    return ("child", n)
    names = [n for n in vars(members[0]) if not n.startswith("_") and n != "training"]
    for n in names:
        values = [getattr(m, n, _NO_DEFAULT) for m in members]
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in values):
            continue
        per_form: dict = {}
        for f, v in zip(form, values):
            per_form.setdefault(f, set()).add(repr(v))
        if all(len(s) == 1 for s in per_form.values()) and len({next(iter(s)) for s in per_form.values()}) == \
                len(forms):
            return ("attr", n)
    return None


def _branch_forms(members, forwards, template, arg_for, groups) -> list:
    specs = {id(m): (None, f, None) for m, f in zip(members, forwards)}
    how = _condition(members, {id(m): _kid_values(m, template, groups, members) for m in members}, specs)
    form = [repr(f) for f in forwards]
    forms = list(dict.fromkeys(form))
    first = {f: forwards[form.index(f)] for f in forms}
    if how[0] == "child":
        name = how[1]
        none_form = next(f for f, m in zip(form, members)
                         if _kid_values(m, template, groups, members)[[n for n, _ in template].index(name)][1] is None)
        other = next(f for f in forms if f != none_form)
        return branch(f"{child_expr(name)} is not None", first[other], first[none_form])
    attr = how[1]
    values = tuple(getattr(m, attr) for m in members)
    arg = arg_for(values, attr, "value")
    value_of = {f: getattr(members[form.index(f)], attr) for f in forms}
    cases = []
    for f in sorted(forms, key=lambda f: value_of[f] is not True):
        v = value_of[f]
        cond = arg.name if v is True else (f"not {arg.name}" if v is False else f"{arg.name} == {literal(v)}")
        cases.append((cond, first[f]))
    out = cases[-1][1]
    for cond, stmts in reversed(cases[:-1]):
        out = branch(cond, stmts, out)
    return out


def _kid_values(member, template, groups, members):
    """``(name, value)`` of each child of ``member``: the template with this instance's arguments."""
    i = members.index(member)
    values = {g[0]: g[1][i] for g in groups}
    return tuple((n, values[v.name] if isinstance(v, Arg) else v) for n, v in template)
