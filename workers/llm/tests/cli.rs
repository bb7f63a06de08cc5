//! The `llm-worker` program: write-random, generate (plain and --chat), bench's JSON lines,
//! and a clear error for a missing model.
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llm-worker"))
}

fn ok(cmd: &mut Command) -> (String, String) {
    let out = cmd.output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{cmd:?} failed:\n{o}\n{e}");
    (o, e)
}

#[test]
fn write_generate_and_bench() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    ok(bin().args(["write-random", "--family", "qwen3", "--shape", "tiny", "--dtype", "f32", "--out"]).arg(&m));
    let (out, err) = ok(bin().args(["generate", "--prompt", "the cat", "--max-tokens", "5", "--device", "cpu", "--model"]).arg(&m));
    assert!(out.starts_with("the cat"), "{out}");
    assert!(err.contains("prefill: ") && err.contains("tokens/s; decode: "), "{err}");
    let (out, _) = ok(bin().args(["generate", "--chat", "--prompt", "hi", "--max-tokens", "3", "--temperature", "0.8", "--top-p", "0.9", "--model"]).arg(&m));
    assert!(out.starts_with("<s><|user|>\nhi</s>\n<|assistant|>\n"), "{out}");
    let (out, _) = ok(bin().args(["bench", "--prompt-len", "6", "--gen", "3", "--concurrency", "1,3", "--model"]).arg(&m));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for (l, c) in lines.iter().zip([1, 3]) {
        assert_eq!(l["concurrency"], c);
        assert!(l["decode_tok_s"].as_f64().unwrap() > 0.0 && l["ttft_ms"].as_f64().unwrap() > 0.0, "{l}");
    }
    // A GGUF llama through gguf-llama, generated on the CPU executor.
    let g = dir.path().join("g.gguf");
    ok(bin().args(["write-random", "--gguf", "q4_0", "--out"]).arg(&g));
    assert!(dir.path().join("tokenizer.json").is_file());
    let (_, err) = ok(bin().args(["generate", "--prompt", "the", "--max-tokens", "2", "--device", "cpu-executor", "--model"]).arg(&g));
    assert!(err.contains("CPU executor") || err.contains("cpu"), "{err}");
}

#[test]
fn missing_model_is_a_clear_error() {
    let out = bin().args(["generate", "--model", "/nonexistent/model"]).output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("/nonexistent/model: not found"), "{e}");
}

#[test]
fn tensor_parallel_generate_and_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    ok(bin().args(["write-random", "--family", "llama", "--shape", "tiny", "--dtype", "f32", "--out"]).arg(&m));
    let gen = |tp: &str| ok(bin().args(["generate", "--prompt", "the cat", "--max-tokens", "6", "--device", "cpu-executor", "--tensor-parallel", tp, "--model"]).arg(&m));
    let ((one, _), (two, err)) = (gen("1"), gen("2"));
    // Greedy: the same text split over two CPU-executor devices.
    assert_eq!(one, two);
    assert!(err.contains("2 x "), "{err}");
    let fail = |args: &[&str]| {
        let out = bin().args(args).arg("--model").arg(&m).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = fail(&["generate", "--device", "cpu-executor", "--tensor-parallel", "3"]);
    assert!(e.contains("attention heads (4) is not divisible by the tensor-parallel size 3"), "{e}");
    let e = fail(&["bench", "--device", "cpu", "--tensor-parallel", "2"]);
    assert!(e.contains("has no communicator"), "{e}");
    // More ranks than GPUs this build or machine can open (this CI machine has none).
    if !cfg!(feature = "cuda") {
        let e = fail(&["bench", "--device", "cuda:0", "--tensor-parallel", "2"]);
        assert!(e.contains("cuda:0..cuda:1") && e.contains("cannot be opened"), "{e}");
    }
    // bench prints the same JSON lines at TP=1 and TP=2, with the rank count and each
    // rank's captured decode buckets.
    let bench = |tp: &str| -> Vec<serde_json::Value> {
        let (out, _) = ok(bin().args(["bench", "--prompt-len", "5", "--gen", "3", "--concurrency", "1,2", "--device", "cpu-executor", "--tensor-parallel", tp, "--model"]).arg(&m));
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let (one, two) = (bench("1"), bench("2"));
    assert_eq!((one.len(), two.len()), (2, 2));
    for (a, b) in one.iter().zip(&two) {
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(a), keys(b));
        assert_eq!((a["tensor_parallel"].as_u64(), b["tensor_parallel"].as_u64()), (Some(1), Some(2)));
        assert_eq!(a["concurrency"], b["concurrency"]);
        assert!(b["decode_tok_s"].as_f64().unwrap() > 0.0, "{b}");
        // One entry per rank (nothing is captured on the CPU executor).
        assert_eq!((a["captured_buckets"].to_string(), b["captured_buckets"].to_string()), ("[[]]".into(), "[[],[]]".into()));
    }
}
