# -*- test-case-name: iop.test.node.adapters.test_cli_parsing -*-
"""
A CLI agent run's launch: the validated settings of one ``cli`` adapter instance
(:class:`CLISettings`, from its spec) and the :class:`LaunchPlan` they make of one run (argv with
placeholders substituted, environment, working directory, stdin). The rules are in the package
docstring (:mod:`iop.node.adapters.cli`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from iop.runtime.chat_input import InputError, parse_chat_input
from iop.runtime.interfaces import ExecutionSpec
from iop.runtime.spec import AdapterSpec

OUTPUT_FORMATS = ("text", "json", "stream-json")
PROMPT_PLACEMENTS = ("arg", "stdin", "placeholder")
PLACEHOLDERS = ("model", "mode", "workspace", "session_id", "prompt")
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "SYSTEMROOT")
DROPPED_ENV = frozenset({"CLAUDECODE"})

DEFAULT_KILL_GRACE_MS = 5000
DEFAULT_EXIT_GRACE_MS = 5000
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024

_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_SESSION_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:-]{0,255}$")

# Find an executable: (command, PATH) -> absolute path or None.
Which = Callable[[str, str | None], str | None]


def which(command: str, path: str | None) -> str | None:
    return shutil.which(command, path=path)


class LaunchError(ValueError):
    """A run cannot be started (bad input, missing workspace or command); the message says why."""


@dataclass(frozen=True)
class LaunchPlan:
    """What one run executes: argv (``argv[0]`` as configured), environment, directory, stdin."""

    executable: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    cwd: str
    stdin: bytes | None


def substitute(arg: str, values: Mapping[str, str]) -> str:
    """Replace known ``{placeholder}``s in one pass; unknown braces are left alone."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


def expand_args(args: Iterable[str], values: Mapping[str, str]) -> list[str]:
    """
    Substitute placeholders in ``args``. An argument that is exactly one placeholder with an
    empty value is dropped along with a directly preceding option (``-x``/``--xx`` without
    ``=``); ``--flag={x}`` with an empty ``x`` is dropped.
    """
    out: list[str] = []
    previous_is_option = False
    for arg in args:
        whole = _PLACEHOLDER.fullmatch(arg)
        if whole is not None and not values.get(whole.group(1), ""):
            if previous_is_option and out:
                out.pop()
            previous_is_option = False
            continue
        if arg.startswith("-") and "=" in arg:
            rest = arg.partition("=")[2]
            inner = _PLACEHOLDER.fullmatch(rest)
            if inner is not None and not values.get(inner.group(1), ""):
                previous_is_option = False
                continue
        out.append(substitute(arg, values))
        previous_is_option = arg.startswith("-") and "=" not in arg and arg not in ("-", "--")
    return out


def build_env(
    config_env: Mapping[str, str],
    inherit: Iterable[str] = (),
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The child's environment: a minimal inherited base, named extras, then ``config_env``."""
    source = os.environ if base is None else base
    env = {name: source[name] for name in (*BASE_ENV, *inherit) if name in source}
    env.update(config_env)
    for name in DROPPED_ENV:
        env.pop(name, None)
    return env


@dataclass(frozen=True)
class CLISettings:
    """An adapter instance's validated configuration."""

    command: str
    args: tuple[str, ...]
    resume_args: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    workspace: str
    mode: str
    output_format: str
    prompt_placement: str
    request_timeout: float
    idle_timeout: float
    kill_grace: float
    exit_grace: float
    inherit_env: tuple[str, ...]
    max_line_bytes: int

    @classmethod
    def from_spec(cls, spec: AdapterSpec) -> CLISettings:
        name = spec.name
        if not spec.command:
            raise ValueError(f"cli adapter {name!r}: command is required")
        output_format = spec.output_format or "text"
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(
                f"cli adapter {name!r}: output_format must be one of {', '.join(OUTPUT_FORMATS)}"
            )
        placement = spec.prompt_placement or "arg"
        if placement not in PROMPT_PLACEMENTS:
            raise ValueError(
                f"cli adapter {name!r}: prompt_placement must be one of "
                f"{', '.join(PROMPT_PLACEMENTS)}"
            )
        has_prompt_placeholder = any("{prompt}" in arg for arg in spec.args)
        if placement == "placeholder" and not has_prompt_placeholder:
            raise ValueError(f"cli adapter {name!r}: prompt_placement placeholder needs {{prompt}}")
        if placement != "placeholder" and has_prompt_placeholder:
            raise ValueError(
                f"cli adapter {name!r}: {{prompt}} in args needs prompt_placement placeholder"
            )
        settings = dict(spec.settings)

        def number(key: str, default: int) -> int:
            raw = settings.get(key, "").strip()
            try:
                value = int(raw) if raw else default
            except ValueError:
                raise ValueError(
                    f"cli adapter {name!r}: settings.{key} must be an integer"
                ) from None
            if value < 0:
                raise ValueError(f"cli adapter {name!r}: settings.{key} must be >= 0")
            return value

        return cls(
            command=spec.command,
            args=tuple(spec.args),
            resume_args=tuple(spec.resume_args),
            env=dict(spec.env),
            workspace=spec.workspace,
            mode=spec.mode,
            output_format=output_format,
            prompt_placement=placement,
            request_timeout=spec.request_timeout_ms / 1000.0,
            idle_timeout=spec.idle_timeout_ms / 1000.0,
            kill_grace=number("kill_grace_ms", DEFAULT_KILL_GRACE_MS) / 1000.0,
            exit_grace=number("exit_grace_ms", DEFAULT_EXIT_GRACE_MS) / 1000.0,
            inherit_env=tuple(
                n.strip() for n in settings.get("inherit_env", "").split(",") if n.strip()
            ),
            max_line_bytes=number("max_line_bytes", DEFAULT_MAX_LINE_BYTES)
            or DEFAULT_MAX_LINE_BYTES,
        )

    def plan(
        self,
        spec: ExecutionSpec,
        which: Which = which,
        environ: Mapping[str, str] | None = None,
    ) -> LaunchPlan:
        """Build the launch of ``spec``; raises :class:`LaunchError` with a clear reason."""
        try:
            prompt = parse_chat_input(spec.input).prompt()
        except InputError as e:
            raise LaunchError(str(e)) from None
        if not prompt.strip():
            raise LaunchError("the input has no user prompt")
        cwd = spec.workspace or self.workspace or "."
        if not os.path.isdir(cwd):
            raise LaunchError(f"workspace {cwd!r} does not exist")
        cwd = os.path.abspath(cwd)
        session_id = spec.session_id
        if session_id:
            if not _SESSION_ID.match(session_id):
                raise LaunchError("invalid session id")
            if not self.resume_args and not any("{session_id}" in a for a in self.args):
                raise LaunchError("this adapter cannot resume sessions (no resume_args)")
        values = {
            "model": spec.target,
            "mode": self.mode,
            "workspace": cwd,
            "session_id": session_id,
            "prompt": prompt,
        }
        argv = [self.command, *expand_args(self.args, values)]
        if session_id:
            argv.extend(expand_args(self.resume_args, values))
        stdin: bytes | None = None
        if self.prompt_placement == "arg":
            argv.append(" " + prompt if prompt.startswith("-") else prompt)
        elif self.prompt_placement == "stdin":
            stdin = prompt.encode("utf-8")
        env = build_env(self.env, self.inherit_env, environ)
        command = self.command
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(cwd, command)
        executable = which(command, env.get("PATH", os.defpath))
        if executable is None:
            raise LaunchError(f"command {self.command!r} not found")
        return LaunchPlan(
            executable=os.path.abspath(executable), argv=argv, env=env, cwd=cwd, stdin=stdin
        )
