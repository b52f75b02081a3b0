"""Prompt loading from JSONL and Parquet (with their errors) and the deterministic rollout-batch source."""

import json
import random

import pytest

from miles.rollout.data_source import PromptDataSource, load_prompt_data
from miles.utils.errors import MilesConfigError


def _write(tmp_path, text, name="data.jsonl"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_loads_upstream_format_in_file_order(tmp_path):
    path = _write(tmp_path, '{"prompt": "3+4=", "label": "7"}\n\n{"prompt": "1+1=", "label": "2", "extra": 1}\n')
    assert load_prompt_data(path, "prompt", "label") == [
        {"prompt": "3+4=", "label": "7"},
        {"prompt": "1+1=", "label": "2"},
    ]


def test_custom_keys_and_labels_that_keep_their_json_value(tmp_path):
    # upstream keeps the label as the dataset has it: its reward functions read sample.label["ground_truth"]
    path = _write(tmp_path, '{"question": "2+2=", "answer": 4}\n{"question": "x", "answer": [1, "a"]}\n'
                            '{"question": "y", "answer": {"ground_truth": "7"}}\n')
    assert load_prompt_data(path, "question", "answer") == [
        {"prompt": "2+2=", "label": 4},
        {"prompt": "x", "label": [1, "a"]},
        {"prompt": "y", "label": {"ground_truth": "7"}},
    ]
    assert load_prompt_data(path, "question", None) == [{"prompt": p, "label": ""} for p in ("2+2=", "x", "y")]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(MilesConfigError, match=r"--prompt-data .*nope\.jsonl.*no such file"):
        load_prompt_data(str(tmp_path / "nope.jsonl"), "prompt", "label")


def test_a_folder_is_named_as_a_folder(tmp_path):
    with pytest.raises(MilesConfigError, match=r"^--prompt-data .*: a folder, not a file\. Pass a JSONL file"):
        load_prompt_data(str(tmp_path), "prompt", "label")


def test_a_file_that_is_not_utf8_names_the_line_and_byte(tmp_path):
    path = tmp_path / "latin1.jsonl"
    first = '{"prompt": "1+1=", "label": "2"}\n'.encode()
    path.write_bytes(first + '{"prompt": "caf\u00e9", "label": "2"}\n'.encode("latin-1"))
    offset = len(first) + len(b'{"prompt": "caf')  # the latin-1 byte 0xe9
    with pytest.raises(MilesConfigError, match=rf"^--prompt-data .* line 2 \(byte {offset} of the file\) is not UTF-8 "
                                               r"\(b'\\xe9': invalid continuation byte\)\. Save the file as UTF-8"):
        load_prompt_data(str(path), "prompt", "label")


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_empty_file_is_a_clear_error(tmp_path, text):
    with pytest.raises(MilesConfigError, match="has no prompts"):
        load_prompt_data(_write(tmp_path, text), "prompt", "label")


def test_malformed_line_names_its_line_number(tmp_path):
    path = _write(tmp_path, '{"prompt": "a", "label": "1"}\n\n{"prompt": "b", "label": \n')
    with pytest.raises(MilesConfigError, match=r"line 3 is not valid JSON"):
        load_prompt_data(path, "prompt", "label")


def test_non_object_line_is_rejected(tmp_path):
    with pytest.raises(MilesConfigError, match=r"line 1 is a JSON list, not an object"):
        load_prompt_data(_write(tmp_path, '["3+4=", "7"]\n'), "prompt", "label")


@pytest.mark.parametrize(
    "key_flag, input_key, label_key", [("--input-key", "input", "label"), ("--label-key", "prompt", "answer")]
)
def test_missing_key_names_line_key_and_flag(tmp_path, key_flag, input_key, label_key):
    path = _write(tmp_path, '{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": "2"}\n')
    with pytest.raises(MilesConfigError, match=rf"line 1 has no key .*\['label', 'prompt'\].*{key_flag}"):
        load_prompt_data(path, input_key, label_key)


def test_non_string_prompt_is_rejected(tmp_path):
    with pytest.raises(MilesConfigError, match=r"line 1: the prompt under 'prompt' is a int"):
        load_prompt_data(_write(tmp_path, '{"prompt": 34, "label": "7"}\n'), "prompt", "label")


PROMPTS = [{"prompt": f"p{i}", "label": str(i)} for i in range(7)]


def _reference_batch(prompts, batch_size, shuffle, seed, rollout_id):
    """Straightforward loop: walk the endless stream of epochs up to the rollout's last position."""
    stream = []
    epoch = 0
    while len(stream) < (rollout_id + 1) * batch_size:
        order = list(range(len(prompts)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        stream.extend(prompts[i] for i in order)
        epoch += 1
    return stream[rollout_id * batch_size : (rollout_id + 1) * batch_size]


def _rollout(source, rollout_id):
    """What the rollout manager does for a rollout without dynamic sampling: draw one batch, then finish."""
    prompts = source.draw(rollout_id, source.rollout_batch_size)
    source.finish(rollout_id)
    return prompts


def _rollouts(source, rollout_ids):
    return [_rollout(source, k) for k in rollout_ids]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 10])
def test_batches_match_a_reference_loop(shuffle, batch_size):
    source = PromptDataSource(PROMPTS, rollout_batch_size=batch_size, shuffle=shuffle, seed=5)
    for rollout_id in range(12):
        assert _rollout(source, rollout_id) == _reference_batch(PROMPTS, batch_size, shuffle, 5, rollout_id)


def test_without_shuffle_batches_follow_file_order_and_wrap():
    source = PromptDataSource(PROMPTS, rollout_batch_size=3, shuffle=False, seed=0)
    labels = [[p["label"] for p in batch] for batch in _rollouts(source, range(3))]
    assert labels[0] == ["0", "1", "2"]
    assert labels[2] == ["6", "0", "1"]  # crosses into epoch 1


def test_shuffled_epochs_are_permutations_in_different_orders():
    source = PromptDataSource(PROMPTS, rollout_batch_size=7, shuffle=True, seed=1)
    epochs = [[p["label"] for p in batch] for batch in _rollouts(source, range(4))]
    assert all(sorted(epoch) == sorted(p["label"] for p in PROMPTS) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1


def test_a_resume_at_the_saved_position_gives_the_same_prompts_as_the_straight_run():
    first = PromptDataSource(PROMPTS, rollout_batch_size=4, shuffle=True, seed=3)
    sequential = _rollouts(first, range(10))
    resumed = PromptDataSource(PROMPTS, rollout_batch_size=4, shuffle=True, seed=3)
    resumed.continue_at(6, 6 * 4)  # what a checkpoint after rollout 5 records: position(6) = 6·B
    assert _rollouts(resumed, range(6, 10)) == sequential[6:]


def test_returned_prompts_are_copies():
    source = PromptDataSource(PROMPTS, rollout_batch_size=2, shuffle=False, seed=0)
    source.draw(0, 2)[0]["prompt"] = "changed"
    assert source.draw(0, 7)[5]["prompt"] == "p0"  # positions 2-8: position 7 is p0 again, in epoch 1


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_bad_batch_size_is_rejected(batch_size):
    with pytest.raises(MilesConfigError, match="--rollout-batch-size"):
        PromptDataSource(PROMPTS, rollout_batch_size=batch_size, shuffle=False, seed=0)


def test_empty_prompts_and_negative_rollout_id_are_rejected():
    with pytest.raises(MilesConfigError, match="no prompts"):
        PromptDataSource([], rollout_batch_size=1, shuffle=False, seed=0)
    with pytest.raises(ValueError, match="rollout_id=-1"):
        PromptDataSource(PROMPTS, rollout_batch_size=1, shuffle=False, seed=0).draw(-1, 1)


def test_loaded_embedded_data_feeds_the_source(embedded):
    prompts = load_prompt_data(embedded.train_jsonl, "prompt", "label")
    source = PromptDataSource(prompts, rollout_batch_size=16, shuffle=True, seed=42)
    assert len(source) == 80
    batches = _rollouts(source, range(6))
    assert [len(batch) for batch in batches] == [16] * 6
    fresh = PromptDataSource(prompts, rollout_batch_size=16, shuffle=True, seed=42)
    assert json.dumps(_rollouts(fresh, range(6))[5]) == json.dumps(batches[5])
    assert {p["prompt"] for batch in batches[:5] for p in batch} == {p["prompt"] for p in prompts}


def _stream_slice(shuffle: bool, start: int, stop: int) -> list[dict]:
    """Positions [start, stop) of the reference stream (batch size 1 reads one position per rollout)."""
    return [_reference_batch(PROMPTS, 1, shuffle, 5, position)[0] for position in range(start, stop)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resume_continues_at_the_saved_position_even_with_another_batch_size(shuffle):
    """Rollouts 0-2 at B = 3 read positions 0-8; a resume at rollout 3 with B = 4 reads 9-12, 13-16: nothing is
    skipped or repeated across the stop."""
    saving = PromptDataSource(PROMPTS, rollout_batch_size=3, shuffle=shuffle, seed=5)
    resumed = PromptDataSource(PROMPTS, rollout_batch_size=4, shuffle=shuffle, seed=5)
    resumed.continue_at(3, saving.position(3))
    assert saving.position(3) == 9 and resumed.position(4) == 13
    with pytest.raises(ValueError, match="rollout_id=2: must be an integer >= 3"):
        resumed.draw(2, 4)
    read = [p for batch in _rollouts(saving, range(3)) + _rollouts(resumed, (3, 4)) for p in batch]
    assert read == _stream_slice(shuffle, 0, 17)


def _write_parquet(tmp_path, rows: list[dict], name="data.parquet") -> str:
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / name
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return str(path)


def test_parquet_rows_load_like_jsonl_lines_with_struct_labels_as_dicts(tmp_path):
    rows = [{"prompt": "3+4=", "label": {"ground_truth": "7"}, "extra": 1},
            {"prompt": "1+1=", "label": {"ground_truth": "2"}, "extra": 2}]
    path = _write_parquet(tmp_path, rows)
    assert load_prompt_data(path, "prompt", "label") == [
        {"prompt": "3+4=", "label": {"ground_truth": "7"}}, {"prompt": "1+1=", "label": {"ground_truth": "2"}}]
    # the same records as JSONL give the same prompts
    jsonl = _write(tmp_path, "".join(json.dumps(row) + "\n" for row in rows))
    assert load_prompt_data(jsonl, "prompt", "label") == load_prompt_data(path, "prompt", "label")


def test_parquet_errors_name_the_row_the_key_and_the_file(tmp_path):
    path = _write_parquet(tmp_path, [{"question": "2+2=", "answer": "4"}])
    with pytest.raises(MilesConfigError, match=r"data\.parquet' row 0 has no key 'prompt'.*--input-key"):
        load_prompt_data(path, "prompt", "answer")
    broken = tmp_path / "broken.parquet"
    broken.write_text('{"prompt": "not parquet"}\n')
    with pytest.raises(MilesConfigError, match=r"broken\.parquet' is not a readable Parquet file"):
        load_prompt_data(str(broken), "prompt", "label")
