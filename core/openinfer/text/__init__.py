"""Text in and out: the tokenizer and chat templates, incremental detokenization and stop strings, reasoning and
tool-call parsers, tool-call arguments, and tiktoken vocabularies converted to BPE."""
