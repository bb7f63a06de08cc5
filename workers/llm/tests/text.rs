//! Tokenizer and chat template: rendering (with the helpers Hugging Face templates use),
//! the tokenizer of a folder and of GGUF metadata, and the typed errors.
use candle_core::quantized::gguf_file;
use llm_worker::random::{RandomModel, Shape, CHAT_TEMPLATE};
use llm_worker::text::render_chat;
use llm_worker::{Error, Family, Message, TextTools};

#[test]
fn renders_the_written_models_template() {
    let msgs = [Message::new("system", "  be brief \n"), Message::new("user", "hi")];
    let out = render_chat(CHAT_TEMPLATE, &msgs, true, Some("<s>"), Some("</s>")).unwrap();
    assert_eq!(out, "<s><|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\n");
    let out = render_chat(CHAT_TEMPLATE, &msgs[1..], false, Some("<s>"), Some("</s>")).unwrap();
    assert_eq!(out, "<s><|user|>\nhi</s>\n");
    // raise_exception reaches the caller as a template error with its message.
    let e = render_chat(CHAT_TEMPLATE, &[Message::new("tool", "x")], true, None, None).unwrap_err();
    assert!(matches!(&e, Error::Template(m) if m.contains("unknown role: tool")), "{e}");
    // A syntax error is a template error too.
    assert!(matches!(render_chat("{% for %}", &msgs, true, None, None), Err(Error::Template(_))));
}

#[test]
fn llama3_style_helpers() {
    // What Llama 3.1's template uses: namespace, strftime_now, tojson (Python's json.dumps:
    // its separators, indent, no HTML escaping), string methods, loop.last; booleans print
    // as Python's `True`.
    let t = r#"{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}
[{{ m.role | upper }}:{{ m.content | trim }}:{{ m.content.split(',') | length }}{% if not loop.last %},{% endif %}]
{%- endfor -%}
|{{ ns.n }}|{{ strftime_now("%Y") }}|{{ {"a": [1, "<b>"]} | tojson }}|{{ {"k": 2} | tojson(indent=2) }}|{{ "x".startswith("x") }}|{{ " y ".strip() }}"#;
    let out = render_chat(t, &[Message::new("user", " a,b "), Message::new("assistant", "c")], false, None, None).unwrap();
    let year = 1970 + std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 31_556_952;
    assert_eq!(out, format!("[USER:a,b:2,][ASSISTANT:c:1]|2|{year}|{{\"a\": [1, \"<b>\"]}}|{{\n  \"k\": 2\n}}|True|y"));
}

#[test]
fn folder_tokenizer_and_template() {
    let dir = tempfile::tempdir().unwrap();
    RandomModel::new(Family::Qwen2, Shape::TINY).write(dir.path()).unwrap();
    let t = TextTools::load(dir.path(), None, 512).unwrap();
    assert_eq!(t.bos_token.as_deref(), Some("<s>"));
    assert_eq!(t.eos_token.as_deref(), Some("</s>"));
    let chat = t.render_chat(&[Message::new("user", "the cat")], true).unwrap();
    let ids = t.encode(&chat).unwrap();
    assert_eq!(ids[0], 510, "<s> is one special token");
    assert!(ids.iter().all(|&i| i < 512));
    assert_eq!(t.decode(&t.encode("the cat sat").unwrap()).unwrap(), "the cat sat");
    // The template in its own file (newer checkpoints), when tokenizer_config.json has none.
    let cfg = dir.path().join("tokenizer_config.json");
    std::fs::write(&cfg, r#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}}"#).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages[0].content }}|{{ eos_token }}").unwrap();
    let t = TextTools::load(dir.path(), None, 512).unwrap();
    assert_eq!(t.render_chat(&[Message::new("user", "x")], true).unwrap(), "x|</s>");
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    let t = TextTools::load(dir.path(), None, 512).unwrap();
    assert!(matches!(t.render_chat(&[Message::new("user", "x")], true), Err(Error::Template(_))));
    // A tokenizer with more ids than the model has embeddings.
    let big = dir.path().join("big.json");
    gguf_llama::write_tokenizer(&big, 600).unwrap();
    assert!(matches!(TextTools::load(dir.path(), Some(&big), 512), Err(Error::VocabMismatch { tokenizer: 600, model: 512, .. })));
    // Missing and malformed tokenizer files.
    assert!(matches!(TextTools::load(dir.path(), Some(&dir.path().join("none.json")), 512), Err(Error::NotFound(_))));
    std::fs::write(dir.path().join("tokenizer.json"), "{ not json").unwrap();
    assert!(matches!(TextTools::load(dir.path(), None, 512), Err(Error::Malformed { .. })));
}

#[test]
fn gguf_tokenizer_from_metadata_or_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // The reference: gguf-llama's byte-level BPE tokenizer.json.
    let tj = dir.path().join("ref.json");
    gguf_llama::write_tokenizer(&tj, 512).unwrap();
    let reference = tokenizers::Tokenizer::from_file(&tj).unwrap();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tj).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); 510];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let merges: Vec<String> = json["model"]["merges"].as_array().unwrap().iter().map(|m| match m {
        serde_json::Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
        s => s.as_str().unwrap().to_string(),
    }).collect();
    use gguf_file::Value as V;
    let arr = |v: &[String]| V::Array(v.iter().cloned().map(V::String).collect());
    let (t, m, tmpl) = (arr(&tokens), arr(&merges), V::String("{{ messages[0]['content'] }}!".into()));
    let (arch, model) = (V::String("llama".into()), V::String("gpt2".into()));
    let path = dir.path().join("m.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &[("general.architecture", &arch), ("tokenizer.ggml.model", &model), ("tokenizer.ggml.tokens", &t), ("tokenizer.ggml.merges", &m), ("tokenizer.chat_template", &tmpl)], &[]).unwrap();
    drop(f);
    let tools = TextTools::load(&path, None, 512).unwrap();
    for text in ["the cat sat on the mat", "zebra quartz, 42!"] {
        assert_eq!(tools.encode(text).unwrap(), reference.encode(text, false).unwrap().get_ids(), "{text}");
    }
    assert_eq!(tools.render_chat(&[Message::new("user", "hey")], true).unwrap(), "hey!");
    // A SentencePiece-kind (llama) tokenizer is not built: the error asks for --tokenizer.
    let spm = V::String("llama".into());
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &[("general.architecture", &arch), ("tokenizer.ggml.model", &spm), ("tokenizer.ggml.tokens", &t)], &[]).unwrap();
    drop(f);
    let e = TextTools::load(&path, None, 512).err().unwrap();
    assert!(matches!(e, Error::NoTokenizer(_)) && e.to_string().contains("--tokenizer"), "{e}");
    // With the tokenizer given, it loads.
    assert!(TextTools::load(&path, Some(&tj), 512).is_ok());
}

#[test]
fn plain_prompts_get_the_tokenizers_bos() {
    // A Llama-style post-processor prepends <s>: plain prompts get it, rendered templates
    // (which write their own) do not.
    let dir = tempfile::tempdir().unwrap();
    RandomModel::new(Family::Llama, Shape::TINY).write(dir.path()).unwrap();
    let mut tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let post = tokenizers::processors::template::TemplateProcessing::builder().try_single("<s> $A").unwrap().special_tokens(vec![("<s>", 510)]).build().unwrap();
    tok.with_post_processor(Some(post));
    let with_bos = dir.path().join("bos.json");
    tok.save(&with_bos, false).unwrap();
    let t = TextTools::load(dir.path(), Some(&with_bos), 512).unwrap();
    let plain = t.encode("the cat").unwrap();
    assert_eq!(t.encode_with("the cat", true).unwrap(), [&[510][..], &plain].concat());
    assert_ne!(plain[0], 510);
}
