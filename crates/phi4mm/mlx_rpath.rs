//! The rpath to the MLX library for binaries that link the `mlx` feature on Linux, shared by the
//! build scripts of the plugin and of the `phi4mm` tool. mlx-sys links `libmlx.so` from the
//! mlx-cpu wheel; a dependency's `rustc-link-arg` does not reach the final binary, so each
//! package that produces one sets it from here.

pub fn emit() {
    println!("cargo:rerun-if-env-changed=PHI4MM_MLX_LIB_DIR");
    let mlx = std::env::var_os("CARGO_FEATURE_MLX").is_some();
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if !(mlx && linux) {
        return;
    }
    match std::env::var("PHI4MM_MLX_LIB_DIR") {
        Ok(dir) => println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}"),
        Err(_) => panic!(
            "the `mlx` feature on Linux needs PHI4MM_MLX_LIB_DIR (the mlx-cpu wheel's lib \
             directory): source scripts/mlx-env.sh first"
        ),
    }
}
