#!/usr/bin/env python3
"""Adjusts a copy of the registry crate mlx-sys 0.7.0 so that it builds on Linux against the
prebuilt MLX of the mlx-cpu wheel. Run by scripts/mlx-env.sh on the copy it makes outside the
repository; each edit checks that the text it replaces is there, so a different mlx-sys fails
loudly instead of half-applied."""

import pathlib
import sys

root = pathlib.Path(sys.argv[1])


def replace(rel, old, new, count=1):
    path = root / rel
    text = path.read_text()
    found = text.count(old)
    if found != count:
        sys.exit(f"mlx-sys-linux: {rel}: expected {count} of {old!r}, found {found}")
    path.write_text(text.replace(old, new))


# 1. The build script: mlx-c only, against the wheel's MLX (MLX_DIR), no macOS link lines, and
#    the mach_approximate_time shim.
replace(
    "build.rs",
    "    build_and_link_mlx_c();\n",
    "    build_and_link_mlx_c_linux();\n",
)
build = root / "build.rs"
build.write_text(
    # The macOS build path (build_and_link_mlx_c and its helpers) stays in the file unused; the
    # allow keeps its dead-code warnings out of every build log (cargo does not cap the lints of a
    # `paths` override as it does a registry crate's).
    "#![allow(dead_code, unused_imports)]\n"
    + build.read_text()
    + r'''
/// Linux: mlx-c against the prebuilt MLX of the mlx-cpu wheel (added by switchyard's
/// scripts/mlx-sys-linux.py).
fn build_and_link_mlx_c_linux() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    let mlx_dir = env::var("MLX_DIR")
        .expect("MLX_DIR (the mlx-cpu wheel's share/cmake/MLX; scripts/mlx-env.sh sets it)");
    let mlx_lib = Path::new(&mlx_dir).join("../../../lib");
    let mut config = Config::new("src/mlx-c");
    config
        .define("CMAKE_BUILD_TYPE", "Release")
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("MLX_DIR", &mlx_dir)
        .build_target("mlxc");
    let dst = config.build();
    println!("cargo:rustc-link-search=native={}/build", dst.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", mlx_lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    cc::Build::new()
        .file("src/mach_time_shim.c")
        .compile("mlx_mach_time_shim");
}
'''
)
(root / "src/mach_time_shim.c").write_text(
    """/* mlx-rs seeds its default RNG with macOS's mach_approximate_time; a monotonic clock in
   nanoseconds stands in for it off Apple targets. */
#include <stdint.h>
#include <time.h>

uint64_t mach_approximate_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
"""
)

# 2. g++ 12 has no <format>: the five messages built by concatenation.
io_h = "src/mlx-c/mlx/c/private/io.h"
replace(
    io_h,
    'std::format("unable to read {} bytes (read {} instead)", n, read_n)',
    '"unable to read " + std::to_string(n) + " bytes (read " + std::to_string(read_n) + " instead)"',
    count=2,
)
replace(
    io_h,
    'std::format("[mlx_io_reader] {} in {}", msg, label())',
    '"[mlx_io_reader] " + msg + " in " + label()',
)
replace(
    io_h,
    'std::format(\n              "unable to write {} bytes (wrote {} instead)", n, wrote_n)',
    '"unable to write " + std::to_string(n) + " bytes (wrote " + std::to_string(wrote_n) + " instead)"',
)
replace(
    io_h,
    'std::format("[mlx_io_writer] {} in {}", msg, label())',
    '"[mlx_io_writer] " + msg + " in " + label()',
)

# 3. The half typedefs off aarch64: C++ takes MLX's own types (what mlx-c's sources cast to);
#    C (bindgen) sees __fp16 (a 2-byte storage type) and uint16_t, the layouts mlx-rs expects.
replace(
    "src/mlx-c/mlx/c/half.h",
    "#ifdef __cplusplus\nextern \"C\" {\n#endif\n",
    """#if !defined(__aarch64__) && !defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC)
#define HAS_FLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
#include "mlx/types/half_types.h"
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
#include <stdint.h>
typedef __fp16 float16_t;
typedef uint16_t bfloat16_t;
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif
""",
)
