"""--apply-chat-template: each prompt is one user message rendered by the tokenizer's chat template (upstream's
meaning), before the rollout and the preflight tokenize it; the embedded tokenizer's own template renders a
conversation in the format its SFT warm-up taught."""

import json

import pytest

from miles.config.arguments import parse_args
from miles.rollout.data_source import chat_prompt, load_prompts
from miles.rollout.embedded import build_tokenizer, sft_batch
from miles.utils.errors import MilesConfigError

# A template that shows every part it renders: the roles, the generation prompt and a template variable.
TAGGED = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
          "{% if add_generation_prompt %}[{{ speaker | default('assistant') }}]{% endif %}")


def _tagged_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TAGGED
    return tokenizer


def test_the_prompt_is_one_user_message_with_the_generation_prompt_and_the_kwargs():
    tokenizer = _tagged_tokenizer()
    assert chat_prompt(tokenizer, "3+4=", {}) == "[user]3+4=[assistant]"
    assert chat_prompt(tokenizer, "3+4=", {"speaker": "bot"}) == "[user]3+4=[bot]"


def test_the_embedded_template_renders_a_prompt_as_itself_and_an_answer_as_the_warm_up_taught_it():
    tokenizer = build_tokenizer()
    assert chat_prompt(tokenizer, "3+4=", {}) == "3+4="
    conversation = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert rendered == "3+4=7<eos>"
    # the SFT warm-up's row for 3+4: <bos> 3 + 4 = 7 <eos> (its input_ids, unpadded: the longest row of one pair)
    input_ids, attention_mask, _ = sft_batch(tokenizer, [(3, 4)])
    assert tokenizer(rendered)["input_ids"] == input_ids[0][attention_mask[0].bool()].tolist()


def _checkpoint(tmp_path, template):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(tmp_path / "ckpt")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": l}) + "\n" for p, l in [("1+2=", "3"), ("5+5=", "10")]))
    return [f"--hf-checkpoint={tmp_path / 'ckpt'}", f"--prompt-data={data}"]


def test_load_prompts_renders_each_prompt_under_the_flag_only(tmp_path):
    words = _checkpoint(tmp_path, TAGGED)
    plain = load_prompts(parse_args(argv=words), str(tmp_path / "train.jsonl"), "--prompt-data")
    assert plain == [{"prompt": "1+2=", "label": "3"}, {"prompt": "5+5=", "label": "10"}]
    args = parse_args(argv=[*words, "--apply-chat-template", "--apply-chat-template-kwargs", '{"speaker": "x"}'])
    assert load_prompts(args, args.prompt_data, "--prompt-data") == [
        {"prompt": "[user]1+2=[x]", "label": "3"}, {"prompt": "[user]5+5=[x]", "label": "10"}]


def test_a_tokenizer_without_a_template_and_kwargs_that_are_not_an_object_are_named(tmp_path):
    args = parse_args(argv=[*_checkpoint(tmp_path, None), "--apply-chat-template"])
    with pytest.raises(MilesConfigError, match="has no chat template"):
        load_prompts(args, args.prompt_data, "--prompt-data")
    args = parse_args(argv=[*_checkpoint(tmp_path, TAGGED), "--apply-chat-template",
                            "--apply-chat-template-kwargs", "[1]"])
    with pytest.raises(MilesConfigError, match=r"--apply-chat-template-kwargs is the JSON list \[1\]"):
        load_prompts(args, args.prompt_data, "--prompt-data")
