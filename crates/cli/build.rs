//! The CLI is a native command. Built for a wasm target (`cargo build
//! --workspace --target wasm32-wasip1`) its binary, also named loopguard,
//! would overwrite the filter's loopguard.wasm with a module Envoy refuses:
//! stop the build with a message saying what to run instead.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        eprintln!(
            "loopguard-cli is a native command and is not built for wasm32 (its binary would \
             overwrite the filter's loopguard.wasm). Build the filter module with \
             `cargo build --release --target wasm32-wasip1` at the workspace root (or \
             `-p loopguard`, or `make build`), and the CLI natively with `make cli`."
        );
        std::process::exit(1);
    }
}
