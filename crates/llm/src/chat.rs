//! ChatML, as SmolLM2's Jinja chat template renders it.
//!
//! Why not llama.cpp's built-in ChatML: its non-Jinja renderer classifies this template as
//! plain ChatML and leaves out the default system turn the real template inserts when the
//! conversation does not start with one, which changes the prompt (and the answer).

/// The system turn SmolLM2's template inserts when the first message is not a system one.
pub const DEFAULT_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// Renders `messages` (`(role, content)` pairs) as ChatML; with `add_generation_prompt`,
/// ends with the opening of the assistant's turn. Tokenize the result with special tokens
/// parsed.
///
/// ```
/// let p = llm::render_chat(&[("user", "Hi")], true);
/// assert_eq!(
///     p,
///     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
///      Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
/// );
/// ```
pub fn render_chat(messages: &[(&str, &str)], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for (i, (role, content)) in messages.iter().enumerate() {
        if i == 0 && *role != "system" {
            push_turn(&mut out, "system", DEFAULT_SYSTEM);
        }
        push_turn(&mut out, role, content);
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

fn push_turn(out: &mut String, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_system_turn_replaces_the_default() {
        let p = render_chat(&[("system", "Be brief."), ("user", "Hi")], false);
        assert_eq!(
            p,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }
}
