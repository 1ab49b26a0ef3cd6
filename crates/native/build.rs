//! The module runs a thread of its own (the tick's clock), so it must never
//! be unloaded while Envoy runs: linked with `-z nodelete`, `dlclose`
//! leaves it mapped (as `do_not_close: true` would in Envoy's config).
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
