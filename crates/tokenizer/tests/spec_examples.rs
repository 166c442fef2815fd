//! The token ids the reference (llama.cpp's `llama-tokenize`) gives for the examples in the
//! spec's tokenizer and chat-template sections, and detokenization / streaming of them.

mod common;

use tokenizer::TokenType;

#[test]
fn spec_table() {
    let Some(tok) = common::tokenizer("spec_table") else {
        return;
    };
    let cases: &[(&str, &[u32])] = &[
        ("Hello world", &[19556, 905]),
        (" leading space", &[2899, 1898]),
        (
            "x = 10 + 20;",
            &[104, 446, 216, 33, 32, 1232, 216, 34, 32, 43],
        ),
        ("héllo 👋", &[88, 2756, 31394, 15107, 235, 229]),
        ("I'm   fine.  OK", &[57, 5248, 256, 4979, 30, 216, 15310]),
        (
            "tab\there\n\nnewlines  ",
            &[15999, 197, 1531, 198, 198, 2241, 5110, 256],
        ),
        (
            "café 你好 don't",
            &[83, 1939, 2756, 216, 18645, 250, 48392, 138, 1326, 982],
        ),
    ];
    for &(text, want) in cases {
        for parse_special in [false, true] {
            assert_eq!(tok.tokenize(text, true, parse_special), want, "{text:?}");
        }
        assert_eq!(
            tok.detokenize(want, true).unwrap(),
            text.as_bytes(),
            "{text:?}"
        );
    }
    let chat = "<|im_start|>user\nHi<|im_end|>";
    assert_eq!(tok.tokenize(chat, true, true), [1, 4093, 198, 26843, 2]);
    assert_eq!(
        tok.tokenize(chat, true, false),
        [
            44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46
        ]
    );
    assert_eq!(tok.tokenize("", true, true), [] as [u32; 0]);
}

#[test]
fn chat_template_rendering_tokenizes_as_the_reference() {
    let Some(tok) = common::tokenizer("chat_template") else {
        return;
    };
    let text = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let want = [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198,
    ];
    assert_eq!(tok.tokenize(text, true, true), want);
    assert_eq!(tok.decode(&want, true).unwrap(), text);
    // Without rendering, control tokens vanish.
    assert_eq!(
        tok.decode(&[1, 4093, 198, 26843, 2], false).unwrap(),
        "user\nHi"
    );
}

#[test]
fn vocabulary_facts() {
    let Some(tok) = common::tokenizer("vocabulary_facts") else {
        return;
    };
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert!(!tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.eog(), [0, 2, 4]);
    assert!(tok.is_eog(4) && !tok.is_eog(3) && !tok.is_eog(5));
    assert_eq!(tok.token_type(16).unwrap(), TokenType::Control);
    assert_eq!(tok.token_type(17).unwrap(), TokenType::Normal);
    assert_eq!(tok.token_text(216).unwrap(), "Ġ");
    assert_eq!(tok.token_id("ĊĊ"), Some(1116));
    let r = tok.piece(49152, true);
    assert!(
        matches!(
            r,
            Err(tokenizer::TokenizerError::BadToken {
                id: 49152,
                n_vocab: 49152
            })
        ),
        "{r:?}"
    );
    assert!(matches!(
        tok.detokenize(&[1, u32::MAX], true),
        Err(tokenizer::TokenizerError::BadToken { id: u32::MAX, .. })
    ));
}

#[test]
fn streaming_holds_back_split_characters() {
    let Some(tok) = common::tokenizer("streaming") else {
        return;
    };
    // "héllo 👋": the emoji's four bytes span ĠðŁ (20 F0 9F), ĳ (91), ĭ (8B).
    let ids = [88, 2756, 31394, 15107, 235, 229];
    let mut s = tok.stream(false);
    let out: Vec<String> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
    assert_eq!(out, ["h", "é", "llo", " ", "", "👋"]);
    assert_eq!(s.pending(), b"");
    assert_eq!(s.finish(), "");
    // An unfinished character at the end becomes U+FFFD.
    let mut s = tok.stream(false);
    assert_eq!(s.push(15107).unwrap(), " ");
    assert_eq!(s.pending(), [0xF0, 0x9F]);
    assert_eq!(s.finish(), "\u{FFFD}");
    // Control tokens: rendered or not.
    let mut s = tok.stream(true);
    assert_eq!(s.push(2).unwrap(), "<|im_end|>");
    let mut s = tok.stream(false);
    assert_eq!(s.push(2).unwrap(), "");
}
