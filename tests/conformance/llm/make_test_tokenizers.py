#!/usr/bin/env python3
"""Writes the small tokenizer.json test inputs of enclave/llm/testdata/tokenizers/.

Each folder has a family's real component structure (normalizer, pre-tokenizer regex, model
flags, post-processor, decoder, special tokens) around a small vocabulary: the 256 byte-level
tokens plus the results of the first merges of a byte-level BPE (the shared tiny model's, which
was trained here on Debian's fortunes; a prefix of a BPE merge list is itself a valid BPE).
The sp-bpe folders start from the generator's SentencePiece BPE (make_tiny_llm.py --tokenizer
sp-bpe). These files are inputs only; the goldens come from tokenizer_reference.mjs.

Usage: python3 make_test_tokenizers.py TINY_LLAMA_TOKENIZER_JSON SP_BPE_FOLDER OUT_FOLDER
"""
import json
import os
import sys

MERGES = 400

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def added(token_id, content, special=True, lstrip=False, rstrip=False, normalized=None):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def byte_level(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def small_vocab(source, extra_words=()):
    vocab = {}
    for token, token_id in source["model"]["vocab"].items():
        if token_id < 256:
            vocab[token] = token_id
    merges = []
    for merge in source["model"]["merges"][:MERGES]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        merges.append([left, right])
        vocab.setdefault(left + right, len(vocab))
    for word in extra_words:  # whole words without merges: only ignore_merges reaches them
        vocab.setdefault(word, len(vocab))
    return vocab, merges


def bpe(vocab, merges, merges_as_pairs, **flags):
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab,
             "merges": merges if merges_as_pairs else [f"{a} {b}" for a, b in merges]}
    model.update(flags)
    return model


def template(bos):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [None], "tokens": [bos]}}}


def write(out, name, tokenizer, config):
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    # Fill TemplateProcessing ids from the added tokens.
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    processors = []
    post = tokenizer.get("post_processor")
    if post:
        processors = post.get("processors", [post])
    for processor in processors:
        for name_, entry in processor.get("special_tokens", {}).items():
            entry["ids"] = [ids[name_]]
    config = dict(config)
    config["added_tokens_decoder"] = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
                                      for t in tokenizer["added_tokens"]}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


def base(added_tokens, normalizer, pre_tokenizer, model, post_processor, decoder):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": decoder, "model": model}


def main():
    source_path, sp_folder, out = sys.argv[1:4]
    with open(source_path, encoding="utf-8") as f:
        source = json.load(f)

    # GPT-2: ByteLevel with its regex, one special token last, "a b" merges, clean-up on, and a
    # non-special <mask> with lstrip (as RoBERTa has).
    vocab, merges = small_vocab(source)
    n = len(vocab)
    write(out, "gpt2", base(
        [added(n, "<|endoftext|>"), added(n + 1, "<mask>", special=False, lstrip=True, normalized=False)],
        None, byte_level(), bpe(vocab, merges, False), byte_level(), byte_level()),
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
         "clean_up_tokenization_spaces": True, "model_max_length": 1024})

    # Llama 3: Split with its regex, ByteLevel without regex, ignore_merges, whole-word tokens only
    # ignore_merges reaches, BOS through TemplateProcessing inside a Sequence.
    vocab, merges = small_vocab(source, ["Ġtokenizer", "Ġhello", "Ġworld", "Ġfortune", "Ġ1234"])
    n = len(vocab)
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|reserved_special_token_2|>", "<|eot_id|>"]
    write(out, "llama3", base(
        [added(n + i, name) for i, name in enumerate(names)], None,
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level(use_regex=False)]},
        bpe(vocab, merges, False, ignore_merges=True),
        {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            template("<|begin_of_text|>")]},
        byte_level()),
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
         "clean_up_tokenization_spaces": True, "model_max_length": 131072})

    # Qwen2: NFC, Split with its regex (single digits), ByteLevel without regex, [a, b] merges, no
    # BOS, and a non-special normalized added token.
    vocab, merges = small_vocab(source)
    n = len(vocab)
    write(out, "qwen2", base(
        [added(n, "<|endoftext|>"), added(n + 1, "<|im_start|>"), added(n + 2, "<|im_end|>"),
         added(n + 3, "<tool_call>", special=False), added(n + 4, "café", special=False, normalized=True)],
        {"type": "NFC"},
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level(use_regex=False)]},
        bpe(vocab, merges, True),
        byte_level(use_regex=False) | {"add_prefix_space": False},
        byte_level(use_regex=False) | {"add_prefix_space": False}),
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "clean_up_tokenization_spaces": False, "model_max_length": 32768})

    # SmolLM: Sequence[Digits individual, ByteLevel with regex], [a, b] merges.
    vocab, merges = small_vocab(source)
    n = len(vocab)
    write(out, "smollm", base(
        [added(n, "<|endoftext|>"), added(n + 1, "<|im_start|>"), added(n + 2, "<|im_end|>")],
        None,
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level()]},
        bpe(vocab, merges, True), byte_level(), byte_level()),
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "clean_up_tokenization_spaces": False,
         "model_max_length": 8192})

    # SentencePiece BPE, Llama 2 / TinyLlama form: the generator's file as it is.
    with open(os.path.join(sp_folder, "tokenizer.json"), encoding="utf-8") as f:
        sp = json.load(f)
    with open(os.path.join(sp_folder, "tokenizer_config.json"), encoding="utf-8") as f:
        sp_config = json.load(f)
    sp_config.pop("chat_template", None)
    write(out, "sp_bpe", sp, {k: v for k, v in sp_config.items() if k != "added_tokens_decoder"})

    # The same vocabulary in the Metaspace form (Mistral v0.3 / newer conversions): no normalizer,
    # Metaspace pre-tokenizer with prepend_scheme "first", decoder ByteFallback then Metaspace.
    meta = dict(sp)
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    meta["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}]}
    write(out, "sp_metaspace", meta, {k: v for k, v in sp_config.items() if k != "added_tokens_decoder"})


if __name__ == "__main__":
    main()
