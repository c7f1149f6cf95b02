//! Generates Rust bindings for ggml's C API.
//!
//! ggml itself is compiled by the `llama-cpp-sys-2` crate (which carries ggml's source); that
//! crate installs ggml's headers under its OUT_DIR and tells us where through the `links`
//! metadata (`DEP_LLAMA_*`). We only run bindgen over the public headers we use.

use std::env;
use std::path::{Path, PathBuf};

const HEADERS: &[&str] = &[
    "ggml.h",
    "ggml-alloc.h",
    "ggml-backend.h",
    "ggml-cpu.h",
    "gguf.h",
    "ggml-rpc.h",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");

    let include = match find_include_dir() {
        Some(dir) => dir,
        None => {
            eprintln!(
                "error: could not find ggml's headers. Expected them under $DEP_LLAMA_ROOT/include \
                 or next to $DEP_LLAMA_GGML_CMAKE_DIR (set by the llama-cpp-sys-2 build)."
            );
            std::process::exit(1);
        }
    };
    println!("cargo:rerun-if-changed={}", include.display());

    let mut builder = bindgen::Builder::default()
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("(ggml|gguf)_.*")
        .allowlist_type("(ggml|gguf)_.*")
        .allowlist_var("(GGML|GGUF)_.*")
        .allowlist_var("RPC_PROTO_.*")
        .prepend_enum_name(false)
        .layout_tests(false)
        .derive_default(true)
        .generate_comments(false);
    for h in HEADERS {
        builder = builder.header(include.join(h).to_string_lossy().into_owned());
    }
    // Fresh machines bootstrap libclang from pip, whose clang lacks the compiler's
    // builtin headers (stddef.h); BINDGEN_EXTRA_CLANG_ARGS carries them in that case.
    let bindings = match builder.generate() {
        Ok(b) => b,
        Err(e) => {
            eprintln!(
                "error: bindgen failed on ggml headers in {}: {e}",
                include.display()
            );
            std::process::exit(1);
        }
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Err(e) = bindings.write_to_file(out.join("ggml_bindings.rs")) {
        eprintln!("error: writing bindings: {e}");
        std::process::exit(1);
    }
}

fn has_headers(dir: &Path) -> bool {
    HEADERS.iter().all(|h| dir.join(h).is_file())
}

fn find_include_dir() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(root) = env::var("DEP_LLAMA_ROOT") {
        candidates.push(PathBuf::from(root).join("include"));
    }
    if let Ok(cmake_dir) = env::var("DEP_LLAMA_GGML_CMAKE_DIR") {
        // <out>/lib/cmake -> <out>/include
        let p = PathBuf::from(cmake_dir);
        if let Some(out) = p.parent().and_then(Path::parent) {
            candidates.push(out.join("include"));
        }
    }
    candidates.into_iter().find(|d| has_headers(d))
}
