//! The GitHub workflow (`.github/workflows/ci.yml`) is well-formed for GitHub Actions' schema
//! as far as this project uses it, and runs the same gate as `.ci/run`; the generated shell
//! completions and manual page cover the flags.

use std::process::Command;

use serde_yaml::Value;

fn workflow() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/.github/workflows/ci.yml");
    let text = std::fs::read_to_string(path).expect("the workflow file");
    serde_yaml::from_str(&text).expect("valid YAML")
}

#[test]
fn workflow_matches_the_actions_schema_and_runs_ci_run() {
    let w = workflow();
    let map = w.as_mapping().expect("a mapping at the top");
    for key in map.keys() {
        let k = key.as_str().expect("string keys");
        assert!(
            ["name", "on", "permissions", "jobs", "env", "concurrency"].contains(&k),
            "unknown top-level key {k}"
        );
    }
    assert!(w.get("on").is_some(), "triggers");
    let jobs = w["jobs"].as_mapping().expect("jobs");
    assert!(!jobs.is_empty());
    let mut runs_ci = false;
    for (name, job) in jobs {
        let name = name.as_str().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "job id {name}"
        );
        assert!(job["runs-on"].as_str().is_some(), "{name}: runs-on");
        let steps = job["steps"].as_sequence().expect("steps");
        assert!(!steps.is_empty(), "{name}: steps");
        for step in steps {
            let uses = step.get("uses").and_then(Value::as_str);
            let run = step.get("run").and_then(Value::as_str);
            assert!(
                uses.is_some() != run.is_some(),
                "{name}: a step either uses or runs"
            );
            if let Some(u) = uses {
                let (repo, reference) = u.split_once('@').expect("owner/repo@ref");
                assert!(repo.contains('/') && !reference.is_empty(), "{u}");
            }
            runs_ci |= run.is_some_and(|r| r.contains(".ci/run"));
        }
    }
    assert!(runs_ci, "a job runs .ci/run");
}

#[test]
fn completions_and_man_page_cover_the_flags() {
    let bin = env!("CARGO_BIN_EXE_sd-cli");
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let o = Command::new(bin)
            .args(["--completions", shell])
            .output()
            .unwrap();
        assert!(o.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("diffusion-model") && text.contains("lora-apply-mode"),
            "{shell}"
        );
    }
    let o = Command::new(bin).arg("--man-page").output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(".TH sd-cli") && text.contains("upscale\\-model"),
        "{text}"
    );
    let o = Command::new(bin)
        .args(["--completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "an unknown shell is an error");
}
