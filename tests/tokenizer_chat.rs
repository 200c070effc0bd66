//! Chat templates of the real models, rendered with Hugging Face semantics, then tokenized with
//! special-token parsing.

mod common;

use kiln::gguf::GgufFile;
use kiln::tokenizer::{render_chat, ChatMessage, Tokenizer};

fn load(model: &str) -> Tokenizer {
    let path = common::real_model(model);
    let f = GgufFile::open(&path).unwrap();
    Tokenizer::from_gguf(&f).unwrap()
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a terse assistant."),
        ChatMessage::new("user", "What is 2+2?"),
    ]
}

#[test]
fn smollm2_template_renders_chatml() {
    let tok = load("smollm2");
    let template = tok.chat_template().expect("SmolLM2 ships a template");
    assert!(!tok.chat_template_is_builtin());

    // The template only adds its default system prompt when the first message is not one.
    let want = "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n\
                <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
                <|im_start|>assistant\n";
    let got = render_chat(
        template,
        &conversation(),
        true,
        "<|im_start|>",
        "<|im_end|>",
    )
    .unwrap();
    assert_eq!(got, want);
    // SmolLM2 does not add BOS, so nothing is stripped.
    assert_eq!(
        tok.apply_chat_template(&conversation(), true).unwrap(),
        want
    );

    let user_only = [ChatMessage::new("user", "hi")];
    let got = render_chat(template, &user_only, false, "", "").unwrap();
    assert_eq!(
        got,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n"
    );

    // Special-token text becomes single ids with parse_special, and only then.
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!((im_start, im_end), (1, 2));
    let ids = tok.encode(want, true, true);
    assert_eq!(ids[0], im_start);
    assert_eq!(ids.iter().filter(|&&id| id == im_start).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == im_end).count(), 2);
    assert_eq!(tok.decode(&ids), want);
    // The tail: <|im_start|> then "assistant\n" as ordinary text.
    let last = ids.iter().rposition(|&id| id == im_start).unwrap();
    assert_eq!(tok.decode(&ids[last + 1..]), "assistant\n");
    assert_eq!(
        &ids[last + 1..],
        &tok.encode("assistant\n", false, false)[..]
    );
    let plain = tok.encode(want, true, false);
    assert!(!plain.contains(&im_start) && !plain.contains(&im_end));
    assert!(tok.is_eog(im_end));
}

#[test]
fn gemma3_template_renders_turns() {
    let tok = load("gemma3");
    // This GGUF has no tokenizer.chat_template: kiln falls back to Gemma 3's own template.
    let template = tok.chat_template().expect("built-in Gemma 3 template");
    assert!(tok.chat_template_is_builtin());

    // The system message is folded into the first user turn; "assistant" is "model".
    let want =
        "<bos><start_of_turn>user\nYou are a terse assistant.\n\nWhat is 2+2?<end_of_turn>\n\
                <start_of_turn>model\n";
    assert_eq!(
        render_chat(template, &conversation(), true, "<bos>", "<eos>").unwrap(),
        want
    );
    let without_prompt = render_chat(template, &conversation(), false, "<bos>", "<eos>").unwrap();
    assert_eq!(
        without_prompt,
        want.strip_suffix("<start_of_turn>model\n").unwrap()
    );

    // apply_chat_template drops the leading <bos> text since encode adds the BOS token.
    let prompt = tok.apply_chat_template(&conversation(), true).unwrap();
    assert_eq!(prompt, want.strip_prefix("<bos>").unwrap());
    let ids = tok.encode(&prompt, true, true);
    let (bos, sot, eot) = (2, 105, 106);
    assert_eq!(tok.token_id("<start_of_turn>"), Some(sot));
    assert_eq!(tok.token_id("<end_of_turn>"), Some(eot));
    assert_eq!(&ids[..2], &[bos, sot]);
    assert_eq!(ids.iter().filter(|&&id| id == bos).count(), 1);
    assert_eq!(ids.iter().filter(|&&id| id == sot).count(), 2);
    assert_eq!(ids.iter().filter(|&&id| id == eot).count(), 1);
    assert!(tok.is_eog(eot));
    assert_eq!(tok.decode(&ids), want);

    // Multi-turn: assistant turns render as "model".
    let turns = [
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", " Hello! "),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        render_chat(template, &turns, true, "<bos>", "<eos>").unwrap(),
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
}
