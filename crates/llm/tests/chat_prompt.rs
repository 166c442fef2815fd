//! SmolLM2's ChatML rendered by `render_chat` and tokenized with special tokens parsed gives
//! llama.cpp's ids for the user turn "Hi" (spec §7, from a llama.cpp reference run).

mod common;

#[test]
fn chat_hi_tokenizes_as_llama_cpp() {
    let Some(file) = common::golden::model_or_skip("chat prompt") else {
        return;
    };
    let tok = tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let text = llm::render_chat(&[("user", "Hi")], true);
    let want: Vec<u32> = "1 9690 198 2683 359 253 5356 5646 11173 3365 3511 308 34519 28 7018 411 \
                          407 19712 8182 2 198 1 4093 198 26843 2 198 1 520 9531 198"
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(tok.tokenize(&text, true, true), want);
    assert_eq!(tok.eog(), llm::SMOLLM2_EOG);
}
