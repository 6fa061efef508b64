#!/usr/bin/env python3
"""Render chat templates with transformers and write the expected outputs.

The Go tests of package chat render every case of the JSON written here and
compare byte for byte. Each case is rendered through
PreTrainedTokenizerBase.apply_chat_template(..., tokenize=False) on a minimal
word-level tokenizer that carries the case's special tokens, which is the path
a transformers user takes; strftime_now is pinned to NOW so that outputs do not
depend on the day they were made.

Usage (on a machine with transformers and jinja2):

    python3 gen_expected.py --shared DIR --own DIR --out expected.json

--shared names a folder holding hf-chat-templates/*.jinja and
hf-qwen2.5-0.5b/tokenizer_config.json (the project's shared/testdata);
--own names this package's testdata/templates.
--jinja2-only renders with jinja2 set up as transformers sets it up, for
checking new cases where transformers is missing; its output is marked as such
and the Go tests refuse it unless CHAT_EXPECTED names the file.

The committed expected.json came from one run on the device machine
(transformers 5.17.0, jinja2 3.1.6; see its meta), with the shared templates
carried in .device/chat/ (hf-chat-templates/*.jinja and
hf-qwen2.5-0.5b/tokenizer_config.json, copies of shared/testdata).
"""

import argparse
import copy
import datetime
import hashlib
import json
import os
import sys

NOW = datetime.datetime(2025, 3, 14, 9, 5, 7)

# Special tokens as the models' tokenizer_config.json files declare them.
QWEN = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
QWEN_BASE = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
GEMMA = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
LLAMA = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
PHI = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "pad_token": "<|endoftext|>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
OWN = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER1 = {"role": "user", "content": "Hello! What is 2+2?"}
ASSIST1 = {"role": "assistant", "content": "2+2 is 4."}
USER2 = {"role": "user", "content": "And times three?"}
UNICODE = {"role": "user", "content": "  Ça va? 日本語 🙂 \"quoted\" <b>&</b>\n\n"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
        "return": {"type": "number", "description": "Temperature"},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

ASK_WEATHER = {"role": "user", "content": "What's the weather in Paris and Zürich?"}


def call(name, args, call_id=None):
    c = {}
    if call_id is not None:
        c["id"] = call_id
    c["type"] = "function"
    c["function"] = {"name": name, "arguments": args}
    return c


def tool_calls_msg(calls, content=None, with_content=False):
    m = {"role": "assistant"}
    if with_content:
        m["content"] = content
    m["tool_calls"] = calls
    return m


def tool_msg(content, call_id=None, name=None):
    m = {"role": "tool", "content": content}
    if call_id is not None:
        m["tool_call_id"] = call_id
    if name is not None:
        m["name"] = name
    return m


def case(name, messages, gen=True, tools=None, tokens=None, extra=None):
    return {
        "case": name,
        "messages": messages,
        "add_generation_prompt": gen,
        "tools": tools,
        "special_tokens": tokens or {},
        "extra": extra or {},
    }


def basic_cases(tokens, system=True):
    """Conversations every template handles."""
    out = []
    if system:
        out += [
            case("system_user", [SYSTEM, USER1], True, tokens=tokens),
            case("system_user_nogen", [SYSTEM, USER1], False, tokens=tokens),
            case("system_multi_turn", [SYSTEM, USER1, ASSIST1, USER2], True, tokens=tokens),
        ]
    out += [
        case("user", [USER1], True, tokens=tokens),
        case("multi_turn", [USER1, ASSIST1, USER2], True, tokens=tokens),
        case("multi_turn_nogen", [USER1, ASSIST1, USER2, {"role": "assistant", "content": "12."}], False, tokens=tokens),
        case("unicode_whitespace", [UNICODE], True, tokens=tokens),
    ]
    return out


def qwen_cases(tokens):
    qwen_calls = [call("get_weather", {"location": "Paris", "unit": "celsius"}), call("get_weather", {"location": "Zürich"})]
    return basic_cases(tokens) + [
        case("tools_system", [SYSTEM, ASK_WEATHER], True, TOOLS, tokens),
        case("tools_no_system", [ASK_WEATHER], True, TOOLS, tokens),
        case(
            "tool_round_trip",
            [
                SYSTEM,
                ASK_WEATHER,
                tool_calls_msg(qwen_calls, "Let me check.", True),
                tool_msg('{"temperature": 18}'),
                tool_msg('{"temperature": 11}'),
                {"role": "assistant", "content": "Paris 18°C, Zürich 11°C."},
                {"role": "user", "content": "Thanks"},
            ],
            True,
            TOOLS,
            tokens,
        ),
        case(
            "tool_call_no_content",
            [ASK_WEATHER, tool_calls_msg([call("get_time", {"tz": "Europe/Paris"})], None, True), tool_msg("09:05")],
            True,
            None,
            tokens,
        ),
        case("empty_tools_list", [SYSTEM, USER1], True, [], tokens),
        case("system_late", [USER1, {"role": "system", "content": "Be brief."}, USER2], True, tokens=tokens),
        case("rejects_parts_content", [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], True, tokens=tokens),
    ]


def deepseek_cases(tokens):
    args1 = '{"location": "Paris"}'
    args2 = '{"location": "Zürich"}'
    return basic_cases(tokens) + [
        case(
            "think_stripped",
            [USER1, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}, USER2],
            True,
            tokens=tokens,
        ),
        case(
            "tool_calls",
            [
                SYSTEM,
                ASK_WEATHER,
                tool_calls_msg([call("get_weather", args1), call("get_weather", args2)], None, True),
                tool_msg("18"),
                tool_msg("11"),
                {"role": "assistant", "content": "Paris 18, Zürich 11."},
            ],
            False,
            tokens=tokens,
        ),
        case(
            "tool_output_last",
            [ASK_WEATHER, tool_calls_msg([call("get_weather", args1)], None, True), tool_msg("18")],
            True,
            tokens=tokens,
        ),
    ]


def gemma_cases(tokens):
    return basic_cases(tokens, system=False) + [
        case("rejects_system", [SYSTEM, USER1], True, tokens=tokens),
        case("rejects_non_alternating", [USER1, USER2], True, tokens=tokens),
    ]


def llama_cases(tokens, builtin):
    single = [call("get_weather", {"location": "Paris", "unit": "celsius"})]
    out = basic_cases(tokens) + [
        case("tools_in_user_message", [SYSTEM, ASK_WEATHER], True, TOOLS, tokens),
        case("tools_in_system", [SYSTEM, ASK_WEATHER], True, TOOLS, tokens, {"tools_in_user_message": False}),
        case(
            "tool_round_trip",
            [
                SYSTEM,
                ASK_WEATHER,
                tool_calls_msg(single),
                tool_msg("18 degrees"),
                {"role": "assistant", "content": "It is 18°C in Paris."},
            ],
            False,
            TOOLS,
            tokens,
        ),
        case("rejects_two_tool_calls", [ASK_WEATHER, tool_calls_msg(single + single)], True, tokens=tokens),
        case("rejects_tools_without_user", [SYSTEM], True, TOOLS, tokens),
        case("date_string", [USER1], True, tokens=tokens, extra={"date_string": "01 Jan 2030"}),
        case("parts_content_as_text", [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], True, tokens=tokens),
    ]
    if builtin:
        out += [
            case(
                "builtin_tools",
                [
                    SYSTEM,
                    {"role": "user", "content": "Search for the weather"},
                    tool_calls_msg([call("brave_search", {"query": "weather Paris"})]),
                    {"role": "ipython", "content": "sunny"},
                ],
                True,
                tokens=tokens,
                extra={"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]},
            ),
        ]
    return out


def phi_cases(tokens):
    return basic_cases(tokens) + [
        case("empty_system_skipped", [{"role": "system", "content": ""}, USER1], True, tokens=tokens),
        case("unknown_role_skipped", [USER1, {"role": "tool", "content": "x"}, USER2], False, tokens=tokens),
    ]


def mistral_cases(tokens):
    calls = [call("get_weather", {"location": "Paris"}, "abcDEF123")]
    return basic_cases(tokens) + [
        case(
            "tools",
            [
                SYSTEM,
                ASK_WEATHER,
                tool_calls_msg(calls),
                tool_msg("18", "abcDEF123"),
                {"role": "assistant", "content": "18°C."},
                {"role": "user", "content": "And Zürich?"},
            ],
            True,
            TOOLS,
            tokens,
        ),
        case("rejects_non_alternating", [SYSTEM, USER1, USER2], True, tokens=tokens),
        case("rejects_bad_call_id", [ASK_WEATHER, tool_calls_msg([call("get_weather", {"location": "Paris"}, "short")])], True, tokens=tokens),
        case("rejects_unknown_role", [USER1, {"role": "critic", "content": "hm"}], True, tokens=tokens),
    ]


def features_cases(tokens):
    parts = [{"type": "text", "text": "Describe"}, {"type": "image"}, {"type": "text", "text": " this picture. "}]
    return [
        case("plain", [SYSTEM, USER1, ASSIST1, USER2], True, None, tokens),
        case("nogen", [USER1], False, None, tokens, {"custom_flag": True}),
        case("parts_and_name", [{"role": "user", "content": parts, "name": "alice"}], True, None, tokens),
        case(
            "tools",
            [ASK_WEATHER, tool_calls_msg([call("get_weather", {"location": "Zürich", "days": 3, "ratio": 0.5, "hourly": False})], "", True)],
            True,
            TOOLS,
            tokens,
            {"custom_flag": "on"},
        ),
        case("many", [USER1, ASSIST1] * 5, True, None, tokens),
    ]


def parts_cases(tokens):
    parts = [{"type": "text", "text": "What is in "}, {"type": "image"}, {"type": "text", "text": "this image?"}]
    return [
        case("string_content", [SYSTEM, USER1], True, tokens=tokens),
        case("parts", [SYSTEM, {"role": "user", "content": parts}], True, tokens=tokens),
        case("parts_multi_turn", [{"role": "user", "content": parts}, ASSIST1, {"role": "user", "content": [{"type": "text", "text": "Sure?"}]}], False, tokens=tokens),
    ]


def whitespace_cases(tokens):
    return [
        case("gen", [SYSTEM, USER1], True, tokens=tokens),
        case("nogen", [USER1], False, tokens=tokens),
    ]


def sources(shared, own):
    """(template name, source description, template text, cases)."""
    hf = os.path.join(shared, "hf-chat-templates")
    table = [
        ("Qwen-Qwen2.5-7B-Instruct", QWEN, qwen_cases),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", DEEPSEEK, deepseek_cases),
        ("google-gemma-2-2b-it", GEMMA, gemma_cases),
        ("meta-llama-Llama-3.1-8B-Instruct", LLAMA, lambda t: llama_cases(t, True)),
        ("meta-llama-Llama-3.2-3B-Instruct", LLAMA, lambda t: llama_cases(t, False)),
        ("microsoft-Phi-3.5-mini-instruct", PHI, phi_cases),
        ("mistralai-Mistral-Nemo-Instruct-2407", MISTRAL, mistral_cases),
    ]
    for name, tokens, make in table:
        path = os.path.join(hf, name + ".jinja")
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        yield name, {"shared": "hf-chat-templates/" + name + ".jinja"}, text, make(tokens)

    cfg = "hf-qwen2.5-0.5b/tokenizer_config.json"
    with open(os.path.join(shared, cfg), encoding="utf-8") as f:
        text = json.load(f)["chat_template"]
    yield "Qwen2.5-0.5B", {"shared": cfg, "key": "chat_template"}, text, qwen_cases(QWEN_BASE)

    for name, make in (("features", features_cases), ("parts", parts_cases), ("whitespace", whitespace_cases)):
        with open(os.path.join(own, name + ".jinja"), encoding="utf-8", newline="") as f:
            text = f.read()
        yield name, {"own": "templates/" + name + ".jinja"}, text, make(OWN)


class FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


def transformers_renderer():
    """apply_chat_template on a minimal tokenizer, with strftime_now pinned.

    Falls back to render_jinja_template, the function apply_chat_template
    delegates to, if no minimal tokenizer can be built; meta says which ran.
    """
    import transformers
    from transformers.utils import chat_template_utils as ctu
    from tokenizers import Tokenizer, models

    if not hasattr(ctu, "datetime"):
        raise RuntimeError("transformers.utils.chat_template_utils has no datetime to pin")
    ctu.datetime = FixedDatetime
    if hasattr(ctu._compile_jinja_template, "cache_clear"):
        ctu._compile_jinja_template.cache_clear()

    cls = getattr(transformers, "PreTrainedTokenizerFast", None) or transformers.TokenizersBackend

    def direct(text, c):
        out = ctu.render_jinja_template(
            conversations=[copy.deepcopy(c["messages"])],
            tools=copy.deepcopy(c["tools"]),
            chat_template=text,
            add_generation_prompt=c["add_generation_prompt"],
            **{**c["special_tokens"], **c["extra"]},
        )
        return out[0][0] if isinstance(out, tuple) else out[0]

    def via_tokenizer(text, c):
        toks = c["special_tokens"]
        vocab = {"<unk_internal>": 0}
        for t in toks.values():
            vocab.setdefault(t, len(vocab))
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk_internal>"))
        tok = cls(tokenizer_object=backend, **toks)
        out = tok.apply_chat_template(
            copy.deepcopy(c["messages"]),
            tools=copy.deepcopy(c["tools"]),
            chat_template=text,
            add_generation_prompt=c["add_generation_prompt"],
            tokenize=False,
            **c["extra"],
        )
        if not isinstance(out, str):
            raise RuntimeError("apply_chat_template returned %r, not a string" % type(out))
        return out

    meta = {"transformers": transformers.__version__}
    probe = case("probe", [USER1], True, tokens={"bos_token": "<s>", "eos_token": "</s>"})
    probe_text = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
    try:
        if via_tokenizer(probe_text, probe) != "<s>" + USER1["content"] + "</s>":
            raise RuntimeError("probe rendered wrongly")
        meta["renderer"] = "transformers.apply_chat_template"
        return via_tokenizer, meta
    except Exception as e:  # report and fall back to the delegate
        print("apply_chat_template path unusable (%s: %s); using render_jinja_template" % (type(e).__name__, e))
        meta["renderer"] = "transformers.render_jinja_template"
        return direct, meta


def jinja2_renderer():
    """jinja2 set up the way transformers sets it up (for checking cases only)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)

    def render(text, c):
        return env.from_string(text).render(
            messages=copy.deepcopy(c["messages"]),
            tools=copy.deepcopy(c["tools"]),
            add_generation_prompt=c["add_generation_prompt"],
            **c["special_tokens"],
            **c["extra"],
        )

    return render, {"renderer": "jinja2-only"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", required=True)
    ap.add_argument("--own", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jinja2-only", action="store_true")
    args = ap.parse_args()

    import jinja2

    render, meta = jinja2_renderer() if args.jinja2_only else transformers_renderer()
    emulate, _ = jinja2_renderer()
    meta.update({"jinja2": jinja2.__version__, "python": sys.version.split()[0], "now": NOW.isoformat()})

    results = []
    counts = {}
    for name, src, text, cases in sources(args.shared, args.own):
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        for c in cases:
            entry = {"template": name, "source": src, "sha256": digest, "case": c["case"], "inputs": {k: v for k, v in c.items() if k != "case"}}
            try:
                entry["expected"] = render(text, c)
            except jinja2.exceptions.TemplateError as e:
                # raise_exception raises TemplateError itself; subclasses are template bugs.
                entry["error"] = str(e)
                entry["error_kind"] = "raise_exception" if type(e) is jinja2.exceptions.TemplateError else type(e).__name__
            except Exception as e:  # a template may fail on a Python type error, too
                entry["error"] = str(e)
                entry["error_kind"] = type(e).__name__
            if not args.jinja2_only:
                try:
                    alt = {"expected": emulate(text, c)}
                except Exception as e:
                    alt = {"error": str(e)}
                if alt.get("expected") != entry.get("expected") or alt.get("error") != entry.get("error"):
                    print("note: %s/%s differs from plain jinja2" % (name, c["case"]))
            results.append(entry)
            counts.setdefault(name, [0, 0])[0 if "expected" in entry else 1] += 1

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "cases": results}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for name, (ok, err) in counts.items():
        print("%-45s %2d rendered %2d errors" % (name, ok, err))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
