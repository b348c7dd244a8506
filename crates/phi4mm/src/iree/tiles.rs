//! Weights stored in tiles for IREE's four-dimensional matrix product (`linalg.mmt4d`), and the
//! products that read them.
//!
//! A weight `w` `[n, k]` is uploaded once as `[⌈n/t⌉, k, t, 1]`, `t` rows per tile (32 on
//! AVX-512, 16 on AVX2: [`TileShape`]): tile `i` holds rows `t·i .. t·i + t`, column by column,
//! so that one step of the reduction reads `t` of the weight's rows contiguously. IREE then
//! runs `x · wᵀ` as a micro-kernel that keeps every row of `x` (up to
//! [`TileShape::max_row_tile`] at a time) in registers against each `t`-row slice of the
//! weight: it reads the weight once whatever the number of rows, and widens bf16 to f32 as it
//! loads.
//!
//! Why: with the weight as stored, IREE (3.13, llvm-cpu) writes a few-row product either as a
//! matrix-vector product per row or as a matrix product whose tiles read the weight once per
//! few rows. IREE's own data tiling would pack the weight the same way, but the decoder's
//! weights are call arguments, so it packed them again on every call (a batch-8 step 6× slower).
//! Packed here, once, at upload, the product got faster for every row count the decoder runs
//! (`docs/benchmarks.md`, "Weights in tiles"): the 200064 × 1024 LM head alone 24.7 → 12.7 ms
//! for 8 rows and 9–12 → 8.1 ms for one.

use rayon::prelude::*;

use super::mlir::{DType, Func, Products, TensorType, Value};

/// How products in tiles fit the CPU's vector registers: the tile sizes of the weights (fixed
/// when the module is emitted and when its weights are uploaded) and of the products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    /// Weight rows per tile: the outputs one row of `x` accumulates at a time.
    pub weight_rows: usize,
    /// The most rows of `x` the micro-kernel holds at once: a decode step's whole batch, up to
    /// this many, is one tile.
    pub max_row_tile: usize,
    /// Rows of `x` per tile where several row tiles share a workgroup ([`workgroup_config`]: a
    /// prefill chunk, a 64-row audio window), the last tile padded.
    shared_row_tile: usize,
    /// Rows of `x` per vector tile where several row tiles share a workgroup
    /// ([`workgroup_config`]).
    vector_rows: usize,
    /// Weight tiles per workgroup where several row tiles share one.
    weight_tiles_per_workgroup: usize,
    /// Rows of `x` per tile in products of more than [`SHARED_ROWS`] rows (an encoder's
    /// window).
    window_row_tile: usize,
    /// Row tiles per workgroup in those products, each a vector tile; `None` leaves the cut,
    /// and the vector tiles, to IREE.
    window_row_tiles_per_workgroup: Option<usize>,
}

impl TileShape {
    /// 32 zmm registers: a row's 32 outputs are two of them, and a vector tile of 8 rows holds
    /// 16 accumulators. Weight tiles of 32 measured against 16 and 64 on the LM head
    /// (`docs/benchmarks.md`, "Weights in tiles").
    pub const AVX512: TileShape = TileShape {
        weight_rows: 32,
        max_row_tile: 16,
        shared_row_tile: 16,
        vector_rows: 8,
        weight_tiles_per_workgroup: 2,
        window_row_tile: 16,
        window_row_tiles_per_workgroup: None,
    };

    /// 16 ymm registers: with AVX-512's tiles, a vector tile of 8 rows × 32 outputs needs 32
    /// accumulators and spills; 16 outputs hold 2 registers per row. On a Zen 3 EPYC, a 64-row
    /// prefill product went 52–71 → 129–135 GFLOP/s with them (`docs/benchmarks.md`, "Tiles
    /// for AVX2").
    ///
    /// A decode batch of up to 8 rows is one tile. A prefill chunk takes tiles of 6 rows, each
    /// its own vector tile: 12 accumulators, the weight's two widened registers and a
    /// broadcast fill 15 of the 16 registers, and each widened weight register serves 6 rows
    /// instead of 4; each workgroup takes one weight tile against every row tile. Against
    /// 8-row tiles in vector tiles of 4 rows, two weight tiles per workgroup, IREE's prefill
    /// of the released decoder's layers went from 165–174 to 203–209 tokens/s on a Zen 3 EPYC
    /// (`docs/benchmarks.md`, "Tiles of six rows for a prefill chunk on AVX2").
    ///
    /// An encoder's larger window takes 6-row tiles too, 16 of them per workgroup against one
    /// weight tile. IREE's own cut (8-row tiles whole) made the real audio encoder's 384-row
    /// window 1.09× slower, in the median of five alternating rounds (`docs/benchmarks.md`,
    /// "Tiles of six rows in the encoders' windows on AVX2").
    pub const AVX2: TileShape = TileShape {
        weight_rows: 16,
        max_row_tile: 8,
        shared_row_tile: 6,
        vector_rows: 6,
        weight_tiles_per_workgroup: 1,
        window_row_tile: 6,
        window_row_tiles_per_workgroup: Some(16),
    };

    /// The shape for IREE's `--iree-llvmcpu-target-cpu`: AVX-512's where the target has
    /// AVX-512 (for `host`, this machine; for a CPU named for a cross compile, the LLVM names
    /// in `AVX512_CPUS`), AVX2's everywhere else. AVX2's fits 16 registers of any width, so
    /// it is also the shape for older x86 and for CPUs of other architectures (unmeasured
    /// there; AVX-512's would need 16 accumulators of 512 bits per vector tile).
    pub fn for_cpu(cpu: &str) -> TileShape {
        let avx512 = if cpu == "host" {
            host_has_avx512()
        } else {
            AVX512_CPUS.contains(&cpu)
        };
        if avx512 {
            TileShape::AVX512
        } else {
            TileShape::AVX2
        }
    }

    /// Rows of `x` per tile of the product: every row at once up to
    /// [`TileShape::max_row_tile`] (a decode step's batch), tiles of `shared_row_tile` up to
    /// [`SHARED_ROWS`] (a prefill chunk), else tiles of `window_row_tile` (an encoder's
    /// window), the last padded.
    fn row_tile(&self, rows: usize) -> usize {
        if rows <= self.max_row_tile {
            rows
        } else if rows <= SHARED_ROWS {
            self.shared_row_tile
        } else {
            self.window_row_tile
        }
    }
}

/// LLVM's x86 CPU names (as `--iree-llvmcpu-target-cpu` takes them) whose CPUs have AVX-512F.
const AVX512_CPUS: &[&str] = &[
    "knl",
    "knm",
    "skylake-avx512",
    "skx",
    "cascadelake",
    "cooperlake",
    "cannonlake",
    "icelake-client",
    "icelake-server",
    "rocketlake",
    "tigerlake",
    "sapphirerapids",
    "emeraldrapids",
    "graniterapids",
    "graniterapids-d",
    "diamondrapids",
    "znver4",
    "znver5",
    "x86-64-v4",
];

fn host_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// A weight `[n, k]` declared in tiles: `tiles` is `[⌈n/t⌉, k, t, 1]` ([`tiled_shape`]) in the
/// weight's stored precision, its rows past `n` zero.
#[derive(Clone, Debug)]
pub struct TiledWeight {
    pub tiles: Value,
    /// Rows of the weight (outputs of the product).
    pub n: usize,
}

/// The shape a weight of `shape` `[n, …]` (read as `[n, k]`) is uploaded in, `tile` rows per
/// tile.
pub fn tiled_shape(shape: &[usize], tile: usize) -> Vec<usize> {
    let n = shape[0];
    let k = shape[1..].iter().product();
    vec![n.div_ceil(tile), k, tile, 1]
}

/// `w` (`[n, k]`, row-major) in tiles of `tile` rows ([`tiled_shape`]); rows past `n` are
/// `T::default()`.
pub fn tile_rows<T: Copy + Default + Send + Sync>(
    w: &[T],
    n: usize,
    k: usize,
    tile: usize,
) -> Vec<T> {
    assert_eq!(w.len(), n * k, "a [{n}, {k}] weight");
    let mut out = vec![T::default(); n.div_ceil(tile) * k * tile];
    out.par_chunks_mut(k * tile)
        .enumerate()
        .for_each(|(t, block)| {
            let rows = (t * tile..(t + 1) * tile).take_while(|&r| r < n);
            for (j, r) in rows.enumerate() {
                for (kk, &v) in w[r * k..(r + 1) * k].iter().enumerate() {
                    block[kk * tile + j] = v;
                }
            }
        });
    out
}

/// The most rows whose tiles one workgroup takes together ([`workgroup_config`]): a prefill
/// chunk's, and a 64-row audio window's.
const SHARED_ROWS: usize = 64;

/// How a product of `rows` rows is cut among workgroups, where IREE's own choice is wrong.
///
/// For a reduction of 2816 or more, IREE (3.13, llvm-cpu) gives each workgroup one row tile
/// against one weight tile (`distribution = [1, 1]`), so a prefill chunk's row tiles read
/// every weight tile separately, and the released decoder's weights (20–100 MB per product) do
/// not stay in cache between them: each was read from memory once per row tile. One
/// workgroup per weight tile or two and every row tile reads the weight once: 64-row products
/// at the released dimensions went from 263–348 to 373–474 GFLOP/s on AVX-512
/// (`docs/benchmarks.md`, "Prefill products read each weight once"). A decode step has one row
/// tile, where other cuts changed nothing measurable. A 64-row audio window is cut as a
/// prefill chunk is. Products of more rows (the encoders' larger windows) take
/// `window_row_tiles_per_workgroup` row tiles per workgroup where the shape names a number,
/// else IREE's choice (`None`).
fn workgroup_config(rows: usize, shape: TileShape) -> Option<String> {
    if rows <= shape.max_row_tile {
        return None;
    }
    // The row tiles `linear_tiled` packs, by the one rule that sizes them.
    let row_tiles = rows.div_ceil(shape.row_tile(rows));
    let m1 = if rows <= SHARED_ROWS {
        row_tiles
    } else {
        row_tiles.min(shape.window_row_tiles_per_workgroup?)
    };
    // The vector tiles are named too: with AVX-512's shape they are IREE's own for these
    // products (8 rows × 32 outputs), but with AVX2's IREE would take 8-row tiles whole, 16
    // accumulators in 16 registers.
    let TileShape {
        weight_rows,
        vector_rows,
        weight_tiles_per_workgroup: per_workgroup,
        ..
    } = shape;
    Some(format!(
        "{{compilation_info = #iree_codegen.compilation_info<\
         lowering_config = #iree_cpu.lowering_config<distribution = [{m1}, {per_workgroup}, 0, 0, 0, 0], \
         vector_common_parallel = [1, 1, 0, {vector_rows}, {weight_rows}, 0], \
         vector_reduction = [0, 0, 1, 0, 0, 1]>, \
         translation_info = #iree_codegen.translation_info<\
         pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>>}}"
    ))
}

impl Func {
    /// `x · wᵀ` over `w` in tiles, for `x` `[…, k]` f32: `x`'s rows are packed into row tiles
    /// (a copy of `x`, not of the weight), multiplied tile by tile, and unpacked into `[…, n]`.
    pub fn linear_tiled(&mut self, x: &Value, w: &TiledWeight) -> Value {
        let r = x.ty.rank();
        let lead: Vec<usize> = x.shape()[..r - 1].to_vec();
        let k = x.dim(r - 1);
        let rows: usize = lead.iter().product();
        let &[n1, wk, n0, 1] = w.tiles.shape() else {
            panic!("weight tiles {}", w.tiles.ty);
        };
        assert_eq!(wk, k, "x {} against weight tiles {}", x.ty, w.tiles.ty);
        let x2 = self.reshape(x, &[rows, k]);
        let Products::Tiles(shape) = self.products() else {
            panic!(
                "products in tiles in a function that writes {:?}",
                self.products()
            );
        };
        assert_eq!(
            n0, shape.weight_rows,
            "weight tiles {} for {shape:?}",
            w.tiles.ty
        );
        let m0 = shape.row_tile(rows);
        let m1 = rows.div_ceil(m0);
        let f32 = DType::F32;
        let packed_x = TensorType::new(&[m1, k, m0, 1], f32);
        let out_tiles = TensorType::new(&[m1, n1, m0, n0], f32);
        let out = TensorType::new(&[rows, w.n], f32);
        let zero = self.fresh(TensorType::new(&[], f32));
        let [empty_x, xp] = [(); 2].map(|_| self.fresh(packed_x.clone()));
        let [empty_o, acc, prod] = [(); 3].map(|_| self.fresh(out_tiles.clone()));
        let [empty_y, y] = [(); 2].map(|_| self.fresh(out.clone()));
        let (z, w_tiles, w_ty) = (&zero.name, &w.tiles.name, &w.tiles.ty);
        let config = workgroup_config(rows, shape).unwrap_or_default();
        for line in [
            format!("{z} = arith.constant 0.0 : f32"),
            format!("{} = tensor.empty() : {packed_x}", empty_x.name),
            format!(
                "{} = linalg.pack {} padding_value({z} : f32) inner_dims_pos = [0, 1] \
                 inner_tiles = [{m0}, 1] into {} : {} -> {packed_x}",
                xp.name, x2.name, empty_x.name, x2.ty
            ),
            format!("{} = tensor.empty() : {out_tiles}", empty_o.name),
            format!(
                "{} = linalg.fill ins({z} : f32) outs({} : {out_tiles}) -> {out_tiles}",
                acc.name, empty_o.name
            ),
            format!(
                "{} = linalg.mmt4d{config} ins({}, {w_tiles} : {packed_x}, {w_ty}) \
                 outs({} : {out_tiles}) -> {out_tiles}",
                prod.name, xp.name, acc.name
            ),
            format!("{} = tensor.empty() : {}", empty_y.name, empty_y.ty),
            format!(
                "{} = linalg.unpack {} inner_dims_pos = [0, 1] inner_tiles = [{m0}, {n0}] \
                 into {} : {out_tiles} -> {}",
                y.name, prod.name, empty_y.name, y.ty
            ),
        ] {
            self.line(&line);
        }
        let mut shape = lead;
        shape.push(w.n);
        self.reshape(&y, &shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_holds_its_rows_column_by_column_and_zero_past_the_end() {
        // 33 rows of 2 columns: w[r][c] = 10·r + c. Two tiles; the second holds row 32 alone.
        let (n, k) = (33, 2);
        let w: Vec<u32> = (0..n)
            .flat_map(|r| (0..k).map(move |c| 10 * r + c))
            .collect();
        let t = tile_rows(&w, n as usize, k as usize, 32);
        assert_eq!(tiled_shape(&[33, 2], 32), [2, 2, 32, 1]);
        assert_eq!(t.len(), 2 * 2 * 32);
        // Tile 0, column 0: rows 0..32; column 1 follows.
        assert_eq!(t[0], 0);
        assert_eq!(t[1], 10);
        assert_eq!(t[31], 310);
        assert_eq!(t[32], 1);
        assert_eq!(t[63], 311);
        // Tile 1: row 32 in lane 0 of each column, zeros after it.
        assert_eq!(t[64], 320);
        assert_eq!(t[65], 0);
        assert_eq!(t[96], 321);
        assert!(t[97..].iter().all(|&v| v == 0));
    }

    #[test]
    fn avx2_tiles_hold_16_rows() {
        let (n, k) = (17, 3);
        let w: Vec<u32> = (0..(n * k) as u32).collect();
        let t = tile_rows(&w, n, k, 16);
        assert_eq!(tiled_shape(&[17, 3], 16), [2, 3, 16, 1]);
        // Tile 0, column 2, lane 5: row 5's third element; tile 1, column 1, lane 0: row 16's.
        assert_eq!(t[2 * 16 + 5], w[5 * k + 2]);
        assert_eq!(t[3 * 16 + 16], w[16 * k + 1]);
        assert!(t[3 * 16 + 17..3 * 16 + 32].iter().all(|&v| v == 0));
    }

    #[test]
    fn only_a_few_row_tiles_share_a_workgroup() {
        // A 64-row prefill chunk: 4 tiles of 16 rows on AVX-512, in vector tiles of 8 × 32, two
        // weight tiles per workgroup; 11 tiles of 6 rows on AVX2, each a vector tile, one
        // weight tile per workgroup. A decode batch (one tile) shares nothing; a larger window
        // is left to IREE on AVX-512 (below for AVX2).
        for (shape, chunk, vector) in [
            (
                TileShape::AVX512,
                "[4, 2, 0, 0, 0, 0]",
                "[1, 1, 0, 8, 32, 0]",
            ),
            (
                TileShape::AVX2,
                "[11, 1, 0, 0, 0, 0]",
                "[1, 1, 0, 6, 16, 0]",
            ),
        ] {
            assert_eq!(
                workgroup_config(shape.max_row_tile, shape),
                None,
                "{shape:?}"
            );
            let config = workgroup_config(64, shape).expect("a 64-row prefill chunk");
            assert!(
                config.contains(&format!("distribution = {chunk}")),
                "{config}"
            );
            assert!(
                config.contains(&format!("vector_common_parallel = {vector}")),
                "{config}"
            );
        }
        // The smallest product of two row tiles.
        let two = workgroup_config(TileShape::AVX2.max_row_tile + 1, TileShape::AVX2);
        assert!(two.expect("two row tiles").contains("distribution = [2, 1"));
        // An encoder's window: IREE's cut on AVX-512; on AVX2, 16 tiles of 6 rows per
        // workgroup (fewer where the window has fewer), each a vector tile.
        assert_eq!(workgroup_config(65, TileShape::AVX512), None);
        assert_eq!(workgroup_config(384, TileShape::AVX512), None);
        for (rows, tiles) in [(65, 11), (384, 16), (500, 16)] {
            let config = workgroup_config(rows, TileShape::AVX2).expect("an AVX2 window");
            assert!(
                config.contains(&format!("distribution = [{tiles}, 1, 0, 0, 0, 0]")),
                "{rows}: {config}"
            );
            assert!(
                config.contains("vector_common_parallel = [1, 1, 0, 6, 16, 0]"),
                "{rows}: {config}"
            );
        }
    }

    #[test]
    fn rows_are_tiled_whole_up_to_the_largest_tile() {
        let wide = TileShape::AVX512;
        assert_eq!(wide.row_tile(1), 1);
        assert_eq!(wide.row_tile(8), 8);
        assert_eq!(wide.row_tile(16), 16);
        assert_eq!(wide.row_tile(64), 16);
        assert_eq!(wide.row_tile(384), 16);
        // AVX2: a decode batch of 8 is one tile; a prefill chunk and an encoder's larger window
        // take tiles of 6.
        assert_eq!(TileShape::AVX2.row_tile(8), 8);
        assert_eq!(TileShape::AVX2.row_tile(9), 6);
        assert_eq!(TileShape::AVX2.row_tile(64), 6);
        assert_eq!(TileShape::AVX2.row_tile(65), 6);
        assert_eq!(TileShape::AVX2.row_tile(384), 6);
    }

    #[test]
    fn a_named_cpu_gets_the_shape_of_its_vector_registers() {
        for cpu in ["sapphirerapids", "znver4", "skylake-avx512", "x86-64-v4"] {
            assert_eq!(TileShape::for_cpu(cpu), TileShape::AVX512, "{cpu}");
        }
        // Client Skylake and Zen 3 stop at AVX2; `generic` and other architectures have 16
        // or 32 narrower registers.
        for cpu in [
            "skylake",
            "znver3",
            "alderlake",
            "x86-64-v3",
            "generic",
            "neoverse-v1",
        ] {
            assert_eq!(TileShape::for_cpu(cpu), TileShape::AVX2, "{cpu}");
        }
    }

    #[test]
    fn the_host_gets_the_shape_of_this_machine() {
        // What the kernel reports, apart from the detection the rule uses.
        let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        let avx512 = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "avx512f"));
        let expected = if avx512 {
            TileShape::AVX512
        } else {
            TileShape::AVX2
        };
        assert_eq!(TileShape::for_cpu("host"), expected);
    }
}
