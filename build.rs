//! No build step: this script exists so that cargo honours the
//! `[build-dependencies]` in Cargo.toml, which only align the features of
//! proc-macro dependencies between `cargo build` and `cargo test` (see the
//! feature unification note there).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
}
