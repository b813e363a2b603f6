"""A chat template rendered as transformers 5.24's apply_chat_template(messages, add_generation_prompt=True,
tokenize=False) renders it (transformers/utils/chat_template_utils.py: _cached_compile_jinja_template and
render_jinja_template), with jinja2 (no transformers, no torch).

The environment is transformers': jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension and the {% generation %} tag (its body rendered as it is: the assistant mask it tracks is
not asked for here), the filter tojson (json.dumps with its arguments, no HTML escaping) and the globals
raise_exception, strftime_now, a limited dict and a namespace that refuses underscored names. The variables are
apply_chat_template's: messages, tools=None, documents=None, add_generation_prompt, and the tokenizer's named
special tokens (its special_tokens_map: bos_token, eos_token, ... as strings, extra_special_tokens only when a
dict names them).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

from mha_runtime.artifact.errors import ArtifactError, ContractError, cut, first_line

# transformers' SPECIAL_TOKENS_ATTRIBUTES (tokenization_utils_base.py), the tokens special_tokens_map names.
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
Message = dict[str, str]


def named_tokens(config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens of a tokenizer_config.json as special_tokens_map gives them: a string, or an
    AddedToken object's content; null and absent ones left out. A dict of extra_special_tokens names model-specific
    ones (transformers' _set_model_specific_special_tokens); a list of them names none."""
    extra = config.get("extra_special_tokens")
    named = {name: config.get(name) for name in NAMED_TOKENS}
    if isinstance(extra, dict):
        named |= extra
    tokens = {}
    for name, value in named.items():
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            tokens[name] = text
    return tokens


def check_messages(messages: object, where: str = "messages") -> list[Message]:
    """A conversation as a list of {"role": str, "content": str} objects, or one ContractError line naming the
    first thing wrong (other keys are refused: the runners pass these two only)."""
    if not isinstance(messages, list) or not messages:
        raise ContractError(f"{where}: expected a non-empty list of {{\"role\", \"content\"}} objects, got "
                            f"{cut(json.dumps(messages, default=repr))}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"} or not all(
                isinstance(message[k], str) for k in ("role", "content")):
            raise ContractError(f"{where}[{i}]: expected an object of a 'role' string and a 'content' string, got "
                                f"{cut(json.dumps(message, default=repr))}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


@lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    """The template compiled in transformers' environment; a template jinja2 cannot parse is one ArtifactError."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):  # type: ignore[misc]
        """{% generation %}...{% endgeneration %}: transformers' AssistantTracker, whose body renders as it is."""

        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        """dict(...) and dict.fromkeys(...) only: no attribute of the type reaches the template."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):  # type: ignore[misc]
        """jinja2's namespace refusing underscore-prefixed names (no way to CPython's internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature trick: namespace(self=...) works
            self, args = args[0], args[1:]
            for name in dict(*args, **kwargs):
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, dict(*args, **kwargs))

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: object) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                       namespace=TemplateNamespace)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ArtifactError(f"chat template: jinja2 cannot parse it ({first_line(exc)})") from None


def render(source: str, messages: list[Message], tokens: dict[str, str], *,
           add_generation_prompt: bool = True) -> str:
    """The text apply_chat_template(messages, add_generation_prompt=..., tokenize=False) gives for a tokenizer with
    this template and these named special tokens. What the template refuses (its raise_exception, an undefined
    name, a type error) is one ContractError line: the messages are what it did not take."""
    template = compile_template(source)
    try:
        return str(template.render(messages=messages, tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **tokens))
    except Exception as exc:  # jinja2's TemplateError, and what the template's own code raised
        raise ContractError(f"chat template: {first_line(exc) or type(exc).__name__}") from None
