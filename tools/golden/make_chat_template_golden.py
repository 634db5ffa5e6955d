#!/usr/bin/env python3
"""Generate golden chat-template fixtures for loraplex's C++ Jinja subset.

What it produces
----------------
Under ``tests/fixtures/golden/chat_templates/`` (or ``--out``):

* ``tokenizer/``: a byte-level BPE tokenizer trained here with HF
  ``tokenizers`` (Qwen2-style Split regex, then ByteLevel without regex;
  ByteLevel decoder; no normalizer and no post-processor), ``len(tokenizer)``
  <= 1024 including the added tokens: every marker the templates write as a
  special token, plus the non-special ``<think>`` and ``</think>``.
  ``tokenizer_config.json`` names bos ``<|begin_of_text|>``, eos
  ``<|eot_id|>``, pad ``<|endoftext|>`` and has ``add_bos_token: false``
  and no ``chat_template``. Every template is rendered with this one
  tokenizer, so e.g. ``bos_token`` in the Gemma- and Mistral-style templates
  renders as ``<|begin_of_text|>``.
* ``templates/<name>.jinja``: chat templates written for these fixtures (none
  is a copy of a published file) in the styles of Llama 3.1, Qwen2.5, Qwen3,
  Mistral, Gemma, Phi-3, SmolLM2 and plain ChatML, plus two with
  ``{% generation %}`` blocks (``chatml_generation``, ``llama3_generation``).
  Between them they use every construct loraplex's interpreter supports (the
  README written next to them lists which template uses which).
* ``conversations.jsonl``: ``{"name", "messages", "tools"?, "kwargs"?}`` per
  line; ``kwargs`` are extra template variables passed to
  ``apply_chat_template(**kwargs)``. Assistant messages may carry the OpenAI
  fine-tuning ``"weight": 0|1``; messages are passed to transformers exactly
  as in the file (``null`` values included: transformers drops them).
* ``expected.jsonl``: one line per (template, conversation,
  add_generation_prompt in [false, true]), the template set as
  ``tokenizer.chat_template``:

  - ``text``: ``apply_chat_template(messages, tools=tools, **kwargs,
    tokenize=False)``; null when rendering raises, and then ``error`` is
    ``str(exception)`` and ``error_type`` its class name (``TemplateError``
    from ``raise_exception``, ``UndefinedError``, ...);
  - ``ids``: the ``input_ids`` of the same call with ``tokenize=True``
    (equal to ``tokenizer(text, add_special_tokens=False)``);
  - ``assistant_mask`` (generation templates only): HF's
    ``return_assistant_tokens_mask=True`` ``assistant_masks``, and
    ``generation_spans``: the ``{% generation %}`` spans as
    ``[start, end)`` code-point offsets into ``text``;
  - ``prefix_mask`` (add_generation_prompt=false lines only, every
    template, the generation ones too as if they had no generation blocks):
    the prefix rule. With ``render(msgs, agp)`` the ``text`` call above
    (same tools and kwargs) and ``full = render(messages, False)``, for each
    message i with role ``assistant`` and ``weight`` != 0 (absent: 1):

    1. ``P = render(messages[:i], True)``; the rule fails when this raises
       or ``full`` does not start with P;
    2. ``Q = render(messages[:i+1], False)``; fails when this raises;
    3. tokenize ``full`` and Q (``tokenizer(x, add_special_tokens=False,
       return_offsets_mapping=True)``); k = the number of leading
       positions j where token j of both has the same id and the same
       ``(start, end)`` offsets; ``end`` = the end offset (code points) of
       full's token k-1, 0 when k == 0. The span is ``[len(P), end)``,
       empty when end <= len(P) (a token-level common prefix: a
       character-level one can stop inside the next turn's marker, e.g.
       after the ``<|`` that ``<|eot_id|>`` and ``<|user|>`` share);
    4. when the message's ``content`` is a string that is not empty after
       ``strip()``, ``content.strip()`` must be a substring of
       ``full[len(P):end]``, and when it has a non-empty ``tool_calls``
       list the span must not be empty; else the rule fails.

    A token of ``full`` (``tokenizer(full, add_special_tokens=False,
    return_offsets_mapping=True)``, offsets ``(s, e)``) is 1 when it
    overlaps a non-empty span ``[a, b)``: ``e > a and s < b``
    (transformers' own rule for ``assistant_masks``), else 0. So a token
    straddling a span edge is marked whole. ``prefix_spans`` holds the
    spans (an empty one as ``[len(P), len(P)]``), for debugging. When the
    rule fails, ``prefix_mask`` is null, there is no ``prefix_spans``, and
    ``prefix_mask_error`` says why (``message {i}: ...``, or ``full
    conversation: ...`` when the full render raises);
  - ``weighted_mask`` (generation templates, add_generation_prompt=false):
    the generation spans, the k-th skipped when the k-th assistant message
    has weight 0; null when the counts differ. These spans map to tokens
    ``char_to_token(s)`` .. ``char_to_token(e - 1)`` per non-empty span
    [s, e); empty spans mark nothing. (On these fixtures this equals the
    overlap rule: a ``note`` field would flag a line where HF's
    ``assistant_mask`` differs from it.)
  - ``turn_examples`` (add_generation_prompt=false lines that render): the
    per-turn rule, used where the prefix rule fails: one ``{"message": i,
    "ids", "mask"}`` per trained assistant turn i, with ``ids`` =
    ``apply_chat_template(messages[:i+1], tokenize=True)`` and ``mask`` 1 on
    the tokens after the longest common token prefix (same ids and offsets)
    with ``apply_chat_template(messages[:i], add_generation_prompt=True)``
    (position 0 never); ``last_turn_examples`` the same for the last
    assistant turn only (``turns: "last"``); ``turn_examples_error`` /
    ``last_turn_examples_error`` when a render raises or a turn has no
    target.

  The console output ends with, per template, how many
  add_generation_prompt=false lines have a ``prefix_mask`` and how many a
  ``prefix_mask_error``.
* ``prompt_completion.jsonl``: for every tokenizer in
  ``tests/fixtures/golden/tokenizers/`` and this chat tokenizer, nasty
  (prompt, completion) pairs: ``ids = tokenizer(prompt + completion).ids``
  (special tokens added) and ``target[j] = 1`` iff token j's character span
  ends after ``len(prompt)``; ``offsets`` are those spans (code points).
* ``trl_conversational.jsonl``: TRL conversational prompt/completion
  examples for chatml, qwen25, llama3 and mistral: ``text`` is the rendered
  prompt+completion, ``ids`` its tokens, ``target`` the tokens ending after
  the rendered prompt-with-generation-prompt.

Why
---
loraplex renders a model's ``chat_template`` with its own C++ Jinja subset
and derives per-token loss masks from it; both must equal Hugging Face
transformers' ``apply_chat_template`` (jinja2 ``ImmutableSandboxedEnvironment``
with ``trim_blocks``, ``lstrip_blocks`` and transformers' own ``tojson``,
``raise_exception``, ``{% generation %}``). transformers is the reference.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install tokenizers==0.23.3 \\
        transformers==5.24.0 jinja2==3.1.6 && \\
        v/bin/python tools/golden/make_chat_template_golden.py

Versions pip resolved when the committed files were made (Python 3.11.7,
``pip install tokenizers==0.23.3 transformers jinja2``): tokenizers 0.23.3,
transformers 5.24.0, jinja2 3.1.6 (MarkupSafe 3.0.4), no torch. The output
is deterministic for these versions (nothing depends on the date: the
templates never call ``strftime_now``).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import jinja2
import tokenizers
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
from tokenizers import pre_tokenizers, trainers
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "golden" / "chat_templates"
TOKENIZER_DIRS = REPO_ROOT / "tests" / "fixtures" / "golden" / "tokenizers"
VERSIONS = {"tokenizers": "0.23.3", "transformers": "5.24.0", "jinja2": "3.1.6"}

QWEN2_STYLE_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL_TOKENS = [
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "[INST]",
    "[/INST]", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]
NON_SPECIAL_TOKENS = ["<think>", "</think>"]
MAX_TOKENS = 1024
TRAIN_VOCAB = 990

# ---------------------------------------------------------------------------
# Templates. Raw strings: '\n' inside them is a Jinja string escape.
# ---------------------------------------------------------------------------

LLAMA3 = r"""{#- Llama 3.1-style chat template, written for loraplex's fixtures. -#}
{{- bos_token }}
{%- if date_string is not defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is defined and tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Knowledge cutoff: December 2023\n" }}
{{- "Current date: " + date_string + "\n\n" }}
{%- if tools is defined and tools is not none %}
    {{- "Answer with a function call when one of these functions helps. " }}
    {{- 'Reply with JSON of the form {"name": function name, "parameters": arguments}.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant', 'tool', 'ipython'] %}
        {{- raise_exception("Unsupported role: " ~ message['role']) }}
    {%- elif message['role'] == 'assistant' and message.tool_calls is defined %}
        {%- if message.tool_calls | length != 1 %}
            {{- raise_exception("Only one tool call per assistant message is supported.") }}
        {%- endif %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
        {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}' }}
        {{- "<|eot_id|>" }}
    {%- elif message['role'] in ['tool', 'ipython'] %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is string %}
            {{- message.content | trim }}
        {%- else %}
            {{- message.content | tojson }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN25 = r"""{#- Qwen2.5-style ChatML with tool calling, written for loraplex's fixtures. -#}
{%- set default_system = "You are Qwen-ish, a helpful assistant." %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- messages[0]['content'] if messages[0]['role'] == 'system' else default_system }}
    {{- "\n\n# Tools\n\nYou can call the functions described inside <tools></tools>:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" + tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nTo call one, write a JSON object with its name and arguments between <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3 = r"""{#- Qwen3-style ChatML with thinking, written for loraplex's fixtures. -#}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nFunctions you may call:\n" }}
    {%- for tool in tools %}
        {%- set fn = tool.function if tool.function is defined else tool %}
        {{- "\n## " ~ fn.name ~ "\n" ~ fn.description | default('') ~ "\n" }}
        {%- for pname, pspec in (fn.parameters.properties | default({})).items() %}
            {{- "- " ~ pname ~ " (" ~ pspec.type | default('any') ~ ")" ~ (": " ~ pspec.description if pspec.description is defined else "") ~ (" [required]" if pname in fn.parameters.required | default([]) else "") ~ "\n" }}
        {%- endfor %}
    {%- endfor %}
    {{- "\nCall a function by writing <tool_call></tool_call> around a JSON object with \"name\" and \"arguments\".<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (loop.length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' ~ tool_call.name ~ '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

MISTRAL = r"""{#- Mistral-style [INST] template, written for loraplex's fixtures. -#}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = none %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is not none %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = r"""{#- Gemma-style template, written for loraplex's fixtures. -#}
{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] | trim + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message['role'] not in ['user', 'assistant'] -%}
        {{- raise_exception('Only user and assistant turns may follow the system prompt.') -}}
    {%- endif -%}
    {%- if (message['role'] == 'user') != (loop.index % 2 == 1) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
<start_of_turn>{{ role }}
{{ (first_user_prefix if loop.first else '') + message['content'] | trim }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}
<start_of_turn>model
{% endif -%}
"""

# Ends in "}}\n": jinja2 drops that last newline (keep_trailing_newline off).
PHI3 = r"""{#- Phi-3-style template, written for loraplex's fixtures. -#}
{%- for message in messages -%}
    {%- if message['role'] == 'system' and not message['content'] -%}
        {%- continue -%}
    {%- endif -%}
    {%- if message['role'] in ['system', 'user', 'assistant'] -%}
        {{- '<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>' + '\n' -}}
    {%- else -%}
        {{- raise_exception('Unknown role ' + message['role']) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>\n' -}}
{%- endif -%}
{{ '' if add_generation_prompt else eos_token }}
"""

# No whitespace control at all: trim_blocks and lstrip_blocks decide.
SMOLLM2 = r"""{# SmolLM2-style ChatML with a default system prompt, for loraplex's fixtures. #}
{% for message in messages %}
    {% if loop.first and messages[0]['role'] != 'system' %}
<|im_start|>system
You are a compact, friendly assistant.<|im_end|>
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt and (messages | last)['role'] != 'assistant' %}
<|im_start|>assistant
{% endif %}
"""

CHATML = r"""{#- Plain ChatML; literal text, so whitespace control decides each newline. -#}
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' -}}
{% endif %}
"""

CHATML_GENERATION = r"""{#- ChatML with each assistant reply marked as a generation span. -#}
{%- for message in messages -%}
    {%- if message['role'] == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- generation -%}
            {{- message['content'] + '<|im_end|>' -}}
        {%- endgeneration -%}
        {{- '\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

LLAMA3_GENERATION = r"""{#- Llama 3-style template with generation spans, for loraplex's fixtures. -#}
{%- set system_messages = messages | selectattr('role', 'equalto', 'system') | list %}
{%- if system_messages | length > 1 or (system_messages | length == 1 and (messages | first)['role'] != 'system') %}
    {{- raise_exception('Only one system message, at the start, is supported.') }}
{%- endif %}
{{- bos_token }}
{%- if system_messages %}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' + system_messages[0]['content'] | trim + '<|eot_id|>' }}
{%- endif %}
{%- set loop_messages = messages[1:] if system_messages else messages %}
{%- for message in loop_messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
    {%- if message['role'] == 'assistant' %}
        {% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}
    {%- else %}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

TEMPLATES = {
    "llama3": LLAMA3,
    "qwen25": QWEN25,
    "qwen3": QWEN3,
    "mistral": MISTRAL,
    "gemma": GEMMA,
    "phi3": PHI3,
    "smollm2": SMOLLM2,
    "chatml": CHATML,
    "chatml_generation": CHATML_GENERATION,
    "llama3_generation": LLAMA3_GENERATION,
}
GENERATION_TEMPLATES = ("chatml_generation", "llama3_generation")
TRL_TEMPLATES = ("chatml", "qwen25", "llama3", "mistral")

# ---------------------------------------------------------------------------
# Conversations.
# ---------------------------------------------------------------------------

# Keys deliberately not sorted: tojson must keep insertion order.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "city": {"type": "string",
                         "description": "City name, e.g. Zürich or 東京"},
            },
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
            "required": ["a", "b"]}}},
]


def call(name: str, arguments: dict | str) -> dict:
  return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    {"name": "single_user",
     "messages": [{"role": "user", "content": "Hello! What can you do?"}]},
    {"name": "user_assistant",
     "messages": [{"role": "user", "content": "What is 2 + 2?"},
                  {"role": "assistant", "content": "2 + 2 = 4."}]},
    {"name": "system_user_assistant",
     "messages": [{"role": "system", "content": "You answer in one short sentence."},
                  {"role": "user", "content": "Why is the sky blue?"},
                  {"role": "assistant",
                   "content": "Air scatters blue light more than red light."}]},
    {"name": "multi_turn",
     "messages": [{"role": "user", "content": "Name a prime number."},
                  {"role": "assistant", "content": "7"},
                  {"role": "user", "content": "Another one?"},
                  {"role": "assistant", "content": "13"},
                  {"role": "user", "content": "And an even one?"},
                  {"role": "assistant", "content": "2 is the only even prime."}]},
    {"name": "multi_turn_weighted",
     "messages": [{"role": "system", "content": "Be terse."},
                  {"role": "user", "content": "Translate 'cat' to French."},
                  {"role": "assistant", "content": "chien", "weight": 0},
                  {"role": "user", "content": "That is wrong. Again?"},
                  {"role": "assistant", "content": "chat", "weight": 1},
                  {"role": "user", "content": "And 'dog'?"},
                  {"role": "assistant", "content": "Chien.", "weight": 0}]},
    {"name": "empty_assistant",
     "messages": [{"role": "user", "content": "Say nothing."},
                  {"role": "assistant", "content": ""}]},
    {"name": "empty_user",
     "messages": [{"role": "system", "content": ""},
                  {"role": "user", "content": ""},
                  {"role": "assistant", "content": "You sent an empty message."}]},
    {"name": "unicode_all_roles",
     "messages": [
         {"role": "system",
          "content": "Réponds en français, 日本語, или по-русски. 👩‍💻"},
         {"role": "user",
          "content": "مرحبا! كيف حالك؟ 👨‍👩‍👧‍👦 e\u0301 vs \u00e9, 한국어"},
         {"role": "assistant",
          "content": "我很好，谢谢！🏳️‍🌈 a\u0308\u0304 שלום 👍🏽"}]},
    {"name": "whitespace",
     "messages": [{"role": "system", "content": "\n  Be careful with spaces.  \n"},
                  {"role": "user", "content": "  leading and trailing  \n\n"},
                  {"role": "assistant", "content": "\n\n\tindented answer\n  "},
                  {"role": "user", "content": " \t "},
                  {"role": "assistant", "content": "line one\r\nline two\n"}]},
    {"name": "tool_single",
     "tools": TOOLS,
     "messages": [
         {"role": "user", "content": "What's the weather in Zürich?"},
         {"role": "assistant", "content": None,
          "tool_calls": [call("get_weather", {"city": "Zürich", "unit": "celsius"})]},
         {"role": "tool", "name": "get_weather",
          "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"},
         {"role": "assistant", "content": "It is 21 °C and sunny in Zürich."}]},
    {"name": "tool_parallel",
     "tools": TOOLS,
     "messages": [
         {"role": "system", "content": "You can use tools."},
         {"role": "user", "content": "Weather in 東京 and 40 + 2?"},
         {"role": "assistant", "content": "",
          "tool_calls": [
              call("get_weather", {"city": "東京", "days": 3, "verbose": True,
                                   "ratio": 2.5, "note": None}),
              # OpenAI's own format: arguments as a JSON string.
              call("add", "{\"b\": 2, \"a\": 40}")]},
         {"role": "tool", "content": "{\"temperature\": 18}"},
         {"role": "tool", "content": "42"},
         {"role": "assistant", "content": "東京 is 18 °C; 40 + 2 = 42."}]},
    {"name": "think_inline",
     "messages": [
         {"role": "user", "content": "Is 91 prime?"},
         {"role": "assistant",
          "content": "<think>\n91 = 7 * 13.\n</think>\n\nNo, 91 = 7 × 13."},
         {"role": "user", "content": "Is 97 prime?"},
         {"role": "assistant",
          "content": "<think>\nNo divisor up to 9 works.\n</think>\n\nYes."}]},
    {"name": "reasoning_content",
     "messages": [
         {"role": "user", "content": "Pick a colour."},
         {"role": "assistant", "content": "Blue.",
          "reasoning_content": "\nThe user wants any colour; blue is common.\n"}]},
    {"name": "bad_alternation",
     "messages": [{"role": "user", "content": "First question."},
                  {"role": "user", "content": "Second question."},
                  {"role": "assistant", "content": "Both answered."}]},
    {"name": "ends_with_user",
     "messages": [{"role": "system", "content": "You are a calculator."},
                  {"role": "user", "content": "3 * 3?"},
                  {"role": "assistant", "content": "9"},
                  {"role": "user", "content": "Now add 1."}]},
    {"name": "special_tokens_in_content",
     "messages": [{"role": "user",
                   "content": "Print <|im_end|> and <think> and [INST] literally."},
                  {"role": "assistant",
                   "content": "Here: <|im_end|> <think> [INST] <|eot_id|>"}]},
    {"name": "template_kwargs",
     "kwargs": {"enable_thinking": False, "date_string": "01 Jan 2025"},
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi there"}]},
]

# ---------------------------------------------------------------------------
# The chat tokenizer.
# ---------------------------------------------------------------------------

TRAIN_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be "
    "this have from or one had by word but not what all were we when your can "
    "said there use an each which she do how their if will up other about out "
    "system user assistant tool tools function functions name arguments "
    "parameters type object string integer description required properties "
    "weather city unit celsius answer question call JSON model helpful "
    "Today Date Cutting Knowledge December Environment ipython prime number "
    "hello world please thanks sunny temperature sentence short careful"
).split()
TRAIN_UNICODE = [
    "日本語のテキストです。", "中文文本，测试一下。", "한국어 텍스트입니다",
    "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "Réponds en français",
    "Zürich", "東京", "👨‍👩‍👧‍👦", "👍🏽", "🏳️‍🌈", "e\u0301", "°C", "×",
]
TRAIN_PUNCT = [".", ",", "!", "?", ":", "\n", "\n\n", "{", "}", "\"", "'", "(",
               ")", "[", "]", "<", ">", "|", "/", "_", "-", "*", "=", "+"]


def training_corpus() -> list[str]:
  rng = random.Random(20261202)
  pieces = TRAIN_WORDS * 3 + TRAIN_PUNCT + TRAIN_UNICODE + ["0", "12", "345"]
  lines = []
  for _ in range(3000):
    text = ""
    for _ in range(rng.randint(1, 20)):
      piece = rng.choice(pieces)
      if rng.random() < 0.1:
        piece = piece.capitalize()
      text += piece if rng.random() < 0.25 else " " + piece
    lines.append(text)
  return lines


def build_tokenizer() -> Tokenizer:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_STYLE_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=TRAIN_VOCAB, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(training_corpus(), trainer)
  tok.add_special_tokens(SPECIAL_TOKENS)
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t in NON_SPECIAL_TOKENS])
  assert tok.post_processor is None
  assert tok.get_vocab_size(with_added_tokens=True) <= MAX_TOKENS
  return tok


def write_tokenizer(folder: Path) -> None:
  folder.mkdir(parents=True)
  # Saved with tokenizers itself: transformers' save_pretrained would write
  # the TemplateProcessing post-processor it installs when there is none.
  build_tokenizer().save(str(folder / "tokenizer.json"))
  config = {"add_bos_token": False, "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>", "pad_token": "<|endoftext|>",
            "model_max_length": 4096}
  with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2, ensure_ascii=False)
    f.write("\n")


# ---------------------------------------------------------------------------
# Rendering and masks.
# ---------------------------------------------------------------------------


def dumps(obj) -> str:
  return json.dumps(obj, ensure_ascii=False, sort_keys=True)


class Renderer:
  """apply_chat_template with one template and one conversation's extras."""

  def __init__(self, tokenizer, template: str, tools, kwargs: dict):
    self.tok = tokenizer
    self.tok.chat_template = template  # as a checkpoint's template would be
    self.template = template
    self.tools = tools
    self.kwargs = kwargs

  def text(self, messages, add_generation_prompt: bool) -> str:
    return self.tok.apply_chat_template(
        messages, tools=self.tools,
        add_generation_prompt=add_generation_prompt, tokenize=False,
        **self.kwargs)

  def ids(self, messages, add_generation_prompt: bool) -> list[int]:
    out = self.tok.apply_chat_template(
        messages, tools=self.tools,
        add_generation_prompt=add_generation_prompt, tokenize=True,
        **self.kwargs)
    ids = out["input_ids"]  # a BatchEncoding: return_dict defaults to True
    assert all(isinstance(i, int) for i in ids), type(ids)
    return list(ids)

  def assistant_mask(self, messages, add_generation_prompt: bool) -> list[int]:
    out = self.tok.apply_chat_template(
        messages, tools=self.tools,
        add_generation_prompt=add_generation_prompt, tokenize=True,
        return_dict=True, return_assistant_tokens_mask=True, **self.kwargs)
    return list(out["assistant_masks"])

  def generation_spans(self, messages, add_generation_prompt: bool):
    """Rendered text and {% generation %} spans, as apply_chat_template gets
    them (same normalization and template variables)."""
    chat = chat_template_utils._normalize_chat_messages(messages)
    variables = {**self.tok.special_tokens_map, **self.kwargs}
    rendered, spans = chat_template_utils.render_jinja_template(
        conversations=[chat], tools=self.tools, chat_template=self.template,
        return_assistant_tokens_mask=True,
        add_generation_prompt=add_generation_prompt, **variables)
    return rendered[0], [tuple(s) for s in spans[0]]


def spans_to_mask(tok, text: str, spans) -> list[int]:
  """Tokens char_to_token(s) .. char_to_token(e - 1) of each non-empty span."""
  enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
  mask = [0] * len(enc["input_ids"])
  for s, e in spans:
    if e <= s:
      continue
    first, last = enc.char_to_token(s), enc.char_to_token(e - 1)
    if first is None or last is None:
      raise RuntimeError(f"span {s}..{e} not covered by tokens")
    for j in range(first, last + 1):
      mask[j] = 1
  return mask


def common_token_prefix_end(tok, a: str, b: str) -> int:
  """End offset (code points) of the last of the leading tokens on which a's
  and b's tokenizations (add_special_tokens=False) agree, in id and in
  (start, end) offsets; 0 when the first tokens already differ. The offsets
  are those of a's tokens."""
  ea = tok(a, add_special_tokens=False, return_offsets_mapping=True)
  eb = tok(b, add_special_tokens=False, return_offsets_mapping=True)
  end = 0
  for ia, oa, ib, ob in zip(ea["input_ids"], ea["offset_mapping"],
                            eb["input_ids"], eb["offset_mapping"]):
    if ia != ib or tuple(oa) != tuple(ob):
      break
    end = oa[1]
  return end


def prefix_spans(render: Renderer, messages) -> list[tuple[int, int]]:
  """The prefix rule: [len(P), end) for each trained assistant turn, where
  P = render(messages[:i], generation prompt) must be a prefix of the full
  render and end is where the common token prefix of the full render and
  Q = render(messages[:i+1]) ends (tokens equal in id and offsets); an
  empty span is [len(P), len(P)). The turn's stripped string content must
  lie inside the span, and a turn with tool_calls must have a non-empty
  span. ValueError when the rule fails."""
  try:
    full = render.text(messages, False)
  except Exception as e:  # noqa: BLE001 - any render failure
    raise ValueError(f"full conversation: rendering raised: {e}") from e
  spans = []
  for i, message in enumerate(messages):
    if message["role"] != "assistant" or message.get("weight", 1) == 0:
      continue
    try:
      p = render.text(messages[:i], True)
    except Exception as e:  # noqa: BLE001 - any render failure
      raise ValueError(f"message {i}: rendering messages[:i] raised: {e}") from e
    if not full.startswith(p):
      raise ValueError(f"message {i}: the full render does not start with "
                       "the prompt render (messages[:i], generation prompt)")
    try:
      q = render.text(messages[:i + 1], False)
    except Exception as e:  # noqa: BLE001 - any render failure
      raise ValueError(f"message {i}: rendering messages[:i+1] raised: {e}") from e
    start = len(p)
    end = max(common_token_prefix_end(render.tok, full, q), start)
    content = message.get("content")
    if isinstance(content, str) and content.strip():
      if content.strip() not in full[start:end]:
        raise ValueError(f"message {i}: its content is not where rendering "
                         "prefixes puts it")
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls and end == start:
      raise ValueError(f"message {i}: it has tool_calls but its span is empty")
    spans.append((start, end))
  return spans


def turn_examples(render: Renderer, messages, last_only: bool = False) -> list[dict]:
  """The per-turn rule for templates that are not prefix-stable: each
  trained assistant turn i (weight != 0) is its own example, rendered as
  the model sees it at inference: ids = render(messages[:i+1]) tokenized;
  targets = its tokens after the longest common token prefix (same ids and
  offsets) with P = render(messages[:i], generation prompt), to the end.
  With last_only, only the last assistant turn, when trained. ValueError
  when a render raises or a turn leaves no target."""
  turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  if last_only:
    turns = turns[-1:]
  examples = []
  for i in turns:
    if messages[i].get("weight", 1) == 0:
      continue
    try:
      p = render.text(messages[:i], True)
      q = render.text(messages[:i + 1], False)
    except Exception as e:  # noqa: BLE001 - any render failure
      raise ValueError(f"message {i}: rendering raised: {e}") from e
    eq = render.tok(q, add_special_tokens=False, return_offsets_mapping=True)
    ep = render.tok(p, add_special_tokens=False, return_offsets_mapping=True)
    common = 0
    for iq, oq, ip, op in zip(eq["input_ids"], eq["offset_mapping"],
                              ep["input_ids"], ep["offset_mapping"]):
      if iq != ip or tuple(oq) != tuple(op):
        break
      common += 1
    ids = list(eq["input_ids"])
    assert ids == render.ids(messages[:i + 1], False)
    mask = [0] * common + [1] * (len(ids) - common)
    if common == 0 and mask:
      mask[0] = 0  # Nothing before position 0 predicts it.
    if not any(mask):
      raise ValueError(f"message {i}: no token after the conversation before it")
    examples.append({"message": i, "ids": ids, "mask": mask})
  return examples


def overlap_mask(tok, text: str, spans) -> list[int]:
  """Tokens whose offsets (s, e) overlap a non-empty span [a, b): e > a and
  s < b (transformers' own rule for generation spans)."""
  enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
  mask = [0] * len(enc["input_ids"])
  for j, (s, e) in enumerate(enc["offset_mapping"]):
    if any(b > a and e > a and s < b for a, b in spans):
      mask[j] = 1
  return mask


def expected_lines(tok, templates: dict, conversations: list) -> list[dict]:
  lines = []
  for name, template in templates.items():
    for conv in conversations:
      render = Renderer(tok, template, conv.get("tools"), conv.get("kwargs", {}))
      messages = conv["messages"]
      for agp in (False, True):
        line = {"template": name, "conversation": conv["name"],
                "add_generation_prompt": agp, "text": None, "error": None,
                "ids": None, "assistant_mask": None, "prefix_mask": None,
                "weighted_mask": None}
        try:
          line["text"] = render.text(messages, agp)
        except Exception as e:  # noqa: BLE001
          line["text"] = None
          line["error"] = str(e)
          line["error_type"] = type(e).__name__
        if line["error"] is None:
          line["ids"] = render.ids(messages, agp)
          plain = tok(line["text"], add_special_tokens=False)["input_ids"]
          assert plain == line["ids"], (name, conv["name"])
          if name in GENERATION_TEMPLATES:
            line["assistant_mask"] = render.assistant_mask(messages, agp)
            text, spans = render.generation_spans(messages, agp)
            assert text == line["text"]
            line["generation_spans"] = [list(s) for s in spans]
            if spans_to_mask(tok, text, spans) != line["assistant_mask"]:
              line["note"] = ("HF's assistant_mask differs from the "
                              "char_to_token mapping of the same spans")
            if not agp:
              weights = [m.get("weight", 1) for m in messages
                         if m["role"] == "assistant"]
              if len(weights) == len(spans):
                kept = [s for s, w in zip(spans, weights) if w != 0]
                line["weighted_mask"] = spans_to_mask(tok, text, kept)
        if not agp:
          try:
            spans = prefix_spans(render, messages)
            line["prefix_mask"] = overlap_mask(tok, render.text(messages, False),
                                               spans)
            line["prefix_spans"] = [list(s) for s in spans]
          except ValueError as e:
            line["prefix_mask_error"] = str(e)
          if line["error"] is None:
            for key, last_only in (("turn_examples", False),
                                   ("last_turn_examples", True)):
              try:
                line[key] = turn_examples(render, messages, last_only)
              except ValueError as e:
                line[key + "_error"] = str(e)
        lines.append(line)
  return lines


# ---------------------------------------------------------------------------
# Prompt/completion pairs.
# ---------------------------------------------------------------------------

PAIRS = [
    ("Hello wor", "ld"),
    ("Hello", " world"),
    ("Hello ", "world"),
    ("Hello  ", " world"),
    ("The number is 12", "345"),
    ("The number is 123", " 456"),
    ("3.", "14159"),
    ("caf", "e\u0301 au lait"),
    ("cafe", "\u0301 au lait"),
    ("na\u0308", "\u0304ve"),
    ("日本", "語のテキスト"),
    ("中文文本，", "测试一下。"),
    ("Line one\n", "Line two"),
    ("Line one", "\nLine two"),
    ("Line one\n\n", "\n\nLine two"),
    ("a\r", "\nb"),
    ("tab\t", "\tafter"),
    ("I", "'m here"),
    ("don", "'t stop"),
    ("👨‍👩", "‍👧‍👦 family"),
    ("flag 🏳️", "‍🌈"),
    ("مرحبا", " بالعالم"),
    ("x = {'key", "': [1, 2]}"),
    ("Answer:", " 42."),
    ("   ", "   spaces"),
]


def special_pairs(tok) -> list[tuple[str, str]]:
  """Pairs with the tokenizer's own special tokens across the boundary."""
  specials = sorted({t.content for t in tok.added_tokens_decoder.values()
                     if t.special})
  pairs = []
  eos = tok.eos_token
  if eos is not None:
    pairs.append(("The answer is", " 42." + eos))
    pairs.append(("Done" + eos, "Next"))
  for token in ("<|im_end|>", "<|eot_id|>"):
    if token in specials and token != eos:
      pairs.append(("User text", token + "\nreply"))
  if "<think>" in tok.get_vocab():
    pairs.append(("<|im_start|>assistant\n", "<think>\nhmm\n</think>\n\nOK"))
  return pairs


def target_mask(offsets, boundary: int) -> list[int]:
  return [1 if end > boundary else 0 for _, end in offsets]


def prompt_completion_lines(tokenizer_dirs: list[Path]) -> list[dict]:
  lines = []
  for folder in tokenizer_dirs:
    tok = AutoTokenizer.from_pretrained(str(folder))
    name = folder.name
    for prompt, completion in PAIRS + special_pairs(tok):
      assert prompt and completion
      enc = tok(prompt + completion, add_special_tokens=True,
                return_offsets_mapping=True)
      offsets = [list(o) for o in enc["offset_mapping"]]
      lines.append({"tokenizer": name, "prompt": prompt,
                    "completion": completion, "ids": list(enc["input_ids"]),
                    "offsets": offsets,
                    "target": target_mask(offsets, len(prompt))})
  return lines


TRL_EXAMPLES = [
    {"prompt": [{"role": "user", "content": "What color is the sky?"}],
     "completion": [{"role": "assistant", "content": "It is blue."}]},
    {"prompt": [{"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "How are you?"}],
     "completion": [{"role": "assistant", "content": "Très bien, merci ! 😊"}]},
    {"prompt": [{"role": "user", "content": "Count to two."},
                {"role": "assistant", "content": "1, 2"},
                {"role": "user", "content": "  Now to three.  "}],
     "completion": [{"role": "assistant", "content": "\n1, 2, 3\n"}]},
]


def trl_lines(tok, templates: dict) -> list[dict]:
  lines = []
  for name in TRL_TEMPLATES:
    for example in TRL_EXAMPLES:
      prompt, completion = example["prompt"], example["completion"]
      line = {"template": name, "prompt": prompt, "completion": completion}
      p = tok.apply_chat_template(prompt, chat_template=templates[name],
                                  add_generation_prompt=True, tokenize=False)
      f = tok.apply_chat_template(prompt + completion,
                                  chat_template=templates[name], tokenize=False)
      if not f.startswith(p):
        line["error"] = "the full render does not start with the prompt render"
        lines.append(line)
        continue
      enc = tok(f, add_special_tokens=False, return_offsets_mapping=True)
      line.update({"text": f, "prompt_text": p, "ids": list(enc["input_ids"]),
                   "target": target_mask(enc["offset_mapping"], len(p))})
      lines.append(line)
  return lines


README = """# Chat-template fixtures

Generated by `tools/golden/make_chat_template_golden.py` (its docstring
documents every field); regenerate from the repository root with

    python3 -m venv v && v/bin/pip install tokenizers==0.23.3 transformers==5.24.0 jinja2==3.1.6 && v/bin/python tools/golden/make_chat_template_golden.py

The reference is Hugging Face transformers' `apply_chat_template`
(transformers 5.24.0, jinja2 3.1.6, tokenizers 0.23.3).

| file | what it is |
|------|------------|
| `tokenizer/` | byte-level BPE tokenizer (`tokenizer.json`, `tokenizer_config.json`, no chat template), every template marker an added token |
| `templates/*.jinja` | chat templates written for these fixtures in the styles of Llama 3.1, Qwen2.5, Qwen3, Mistral, Gemma, Phi-3, SmolLM2, ChatML, plus `chatml_generation` / `llama3_generation` with `{% generation %}` |
| `conversations.jsonl` | the conversations (`name`, `messages`, optional `tools`, optional template `kwargs`) |
| `expected.jsonl` | per (template, conversation, add_generation_prompt): `text`, `error`, `ids`, `assistant_mask`, `prefix_mask` / `prefix_mask_error` / `prefix_spans`, `weighted_mask`, `generation_spans` |
| `prompt_completion.jsonl` | joint prompt+completion tokenization for the tokenizers in `../tokenizers/` and `tokenizer/`: `ids`, `offsets` (code points), `target` |
| `trl_conversational.jsonl` | TRL conversational prompt/completion examples: `text`, `prompt_text`, `ids`, `target` |

`prefix_mask` (the `add_generation_prompt: false` lines, every template,
the `*_generation` ones too as if they had no generation blocks) is the
prefix rule. With `render(msgs, agp)` =
`apply_chat_template(msgs, tools=..., add_generation_prompt=agp, tokenize=False, **kwargs)`
(the line's own tools and kwargs) and `full = render(messages, False)`, for
each message `i` with role `assistant` and `weight` != 0 (absent: 1):

1. `P = render(messages[:i], True)`; the rule fails if this raises or
   `full` does not start with `P`;
2. `Q = render(messages[:i+1], False)`; the rule fails if this raises;
3. tokenize `full` and `Q` with
   `tokenizer(x, add_special_tokens=False, return_offsets_mapping=True)`;
   `k` is the number of leading positions `j` where token `j` of both has
   the same id and the same `(start, end)` offsets, and `end` is the end
   offset (code points) of `full`'s token `k-1`, or 0 when `k == 0`; the
   span is `[len(P), end)`, empty when `end <= len(P)` (a token-level
   common prefix: a character-level one can stop inside the next turn's
   marker, e.g. after the `<|` that `<|eot_id|>` and `<|user|>` share);
4. if the message's `content` is a string that is non-empty after
   `strip()`, `content.strip()` must occur in `full[len(P):end]`, and if it
   has a non-empty `tool_calls` list the span must be non-empty, else the
   rule fails.

A token of `full` (`tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)`,
offsets `(s, e)`) is 1 iff it overlaps a non-empty span `[a, b)`:
`e > a and s < b` (transformers' rule for `assistant_masks`), so a token
across a span edge is marked whole. `prefix_spans` lists the spans (an empty
one as `[len(P), len(P)]`). When the rule fails, `prefix_mask` is null,
`prefix_spans` is absent and `prefix_mask_error` gives the reason
(`message {i}: ...`, or `full conversation: ...` when the full render
raises).

Every template is rendered with the one tokenizer above (bos
`<|begin_of_text|>`, eos `<|eot_id|>`, pad `<|endoftext|>`), so `bos_token`
in the Gemma- and Mistral-style templates renders as `<|begin_of_text|>`.
Templates are read as the files are, including a final newline, which
jinja2 drops (`keep_trailing_newline` is off).

Where the constructs are used:

| construct | templates |
|-----------|-----------|
| `{%- -%}`, `{{- -}}` | gemma, phi3, chatml, chatml_generation |
| no whitespace control (trim_blocks + lstrip_blocks only) | smollm2; `{% generation %}` in llama3_generation |
| literal text between tags | chatml, gemma, smollm2 |
| `{# #}` / `{#- -#}` comments | all |
| `if` / `elif` / `else` | llama3, qwen25, qwen3 |
| `set` at top level; reassigning `messages` | llama3 (`set messages = messages[1:]`), mistral, gemma |
| `namespace`, `set ns.attr` inside a loop | qwen3 |
| reassigning the loop variable | qwen25, qwen3 (`set tool_call = tool_call.function`) |
| `loop.index0 index first last length` | qwen25, qwen3, gemma (`loop.index`), mistral |
| `{% break %}` / `{% continue %}` | qwen3 / phi3 |
| `is defined`, `is not defined`, `is none`/`is not none`, `is string`, `is false` | llama3, qwen25, qwen3, mistral |
| `in`, `not in` (list literal and substring) | llama3, gemma, phi3, qwen3 |
| filters `trim length tojson tojson(indent=4) selectattr list first last default` | llama3, llama3_generation, qwen25, qwen3, smollm2 |
| string methods `strip lstrip rstrip startswith endswith split` | qwen3 |
| `+`, `~`, `%`, `!=`, `>`, `and or not`, inline `x if c else y` | most |
| slices `[1:]`, `[::-1]`; negative index `[-1]` | llama3, mistral, gemma, qwen3 |
| `.items()` on a dict, dict/list literals `{}` `[]` | qwen3 |
| `raise_exception` | llama3, mistral, gemma, phi3, llama3_generation |
| extra template variables (`date_string`, `enable_thinking`) | llama3, qwen3 (conversation `template_kwargs`) |
"""


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  args = parser.parse_args()
  found = {"tokenizers": tokenizers.__version__,
           "transformers": transformers.__version__,
           "jinja2": jinja2.__version__}
  for package, version in VERSIONS.items():
    if found[package] != version:
      print(f"warning: {package} {found[package]}, fixtures were made with "
            f"{version}", file=sys.stderr)
  if args.out.exists():
    shutil.rmtree(args.out)
  args.out.mkdir(parents=True)
  write_tokenizer(args.out / "tokenizer")
  (args.out / "templates").mkdir()
  for name, text in TEMPLATES.items():
    (args.out / "templates" / f"{name}.jinja").write_text(text, encoding="utf-8")
  with open(args.out / "conversations.jsonl", "w", encoding="utf-8") as f:
    for conv in CONVERSATIONS:  # key order kept: templates see it via tojson
      f.write(json.dumps(conv, ensure_ascii=False) + "\n")
  (args.out / "README.md").write_text(README, encoding="utf-8")

  # Everything below reads back what was written, as the C++ test will.
  tok = AutoTokenizer.from_pretrained(str(args.out / "tokenizer"))
  assert tok.chat_template is None
  assert len(tok) <= MAX_TOKENS, len(tok)
  templates = {path.stem: path.read_text(encoding="utf-8")
               for path in sorted((args.out / "templates").glob("*.jinja"))}
  templates = {name: templates[name] for name in TEMPLATES}
  with open(args.out / "conversations.jsonl", encoding="utf-8") as f:
    conversations = [json.loads(line) for line in f]

  lines = expected_lines(tok, templates, conversations)
  with open(args.out / "expected.jsonl", "w", encoding="utf-8") as f:
    for line in lines:
      f.write(dumps(line) + "\n")
  tokenizer_dirs = sorted(p for p in TOKENIZER_DIRS.iterdir() if p.is_dir())
  tokenizer_dirs.append(args.out / "tokenizer")
  with open(args.out / "prompt_completion.jsonl", "w", encoding="utf-8") as f:
    for line in prompt_completion_lines(tokenizer_dirs):
      f.write(dumps(line) + "\n")
  with open(args.out / "trl_conversational.jsonl", "w", encoding="utf-8") as f:
    for line in trl_lines(tok, templates):
      f.write(dumps(line) + "\n")
  errors = sum(1 for line in lines if line["error"] is not None)
  print(f"tokenizer: {len(tok)} tokens; {len(lines)} expected lines, "
        f"{errors} render errors")
  print("prefix rule (add_generation_prompt=false lines): "
        "template: prefix_mask / prefix_mask_error")
  for name in templates:
    rows = [line for line in lines
            if line["template"] == name and not line["add_generation_prompt"]]
    ok = sum(1 for line in rows if line["prefix_mask"] is not None)
    failed = sum(1 for line in rows if "prefix_mask_error" in line)
    per_turn = sum(1 for line in rows
                   if line["prefix_mask"] is None and line.get("turn_examples"))
    print(f"  {name}: {ok} / {failed} ({per_turn} trained per turn instead)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
