//! A small builder for StableHLO functions as MLIR text.
//!
//! Every op is printed in MLIR's generic form (`"stablehlo.add"(%a, %b) : (...) -> ...`), which
//! needs no knowledge of each op's custom pretty syntax and is stable across IREE releases. Values
//! carry their static type, so shapes are checked here, when the emitter runs, with a message that
//! names the op — not later inside the compiler.

use std::fmt::Write as _;

/// The most rows of `x` one `x · wᵀ` product takes ([`Func::linear_t`]). With data tiling, IREE
/// (3.13, llvm-cpu) tiles a larger product so that it ran at about half the speed of the same
/// work cut into blocks: 5200 × 1024 × 1024 took 105 ms whole against 58 ms as ten blocks of
/// 520 rows, and SigLIP's 1024 × 1152 × 4304 101 ms against 54 ms as two blocks
/// (`docs/benchmarks.md`, "encoders in blocks"). Up to 512 rows every shape measured was fast.
pub const PRODUCT_ROWS: usize = 512;

/// Element types the emitters use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
    I16,
    I32,
    I1,
}

impl DType {
    pub fn mlir(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I1 => "i1",
        }
    }
}

/// A static tensor type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl TensorType {
    pub fn new(shape: &[usize], dtype: DType) -> Self {
        TensorType {
            shape: shape.to_vec(),
            dtype,
        }
    }

    pub fn f32(shape: &[usize]) -> Self {
        TensorType::new(shape, DType::F32)
    }

    pub fn i32(shape: &[usize]) -> Self {
        TensorType::new(shape, DType::I32)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType::new(&self.shape, dtype)
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype.mlir())
    }
}

/// An SSA value of a function under construction.
#[derive(Clone, Debug)]
pub struct Value {
    pub(super) name: String,
    pub ty: TensorType,
}

impl Value {
    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn dim(&self, i: usize) -> usize {
        self.ty.shape[i]
    }
}

fn list(xs: &[usize]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn arr(xs: &[usize]) -> String {
    if xs.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", list(xs))
    }
}

/// Elementwise binary ops.
#[derive(Clone, Copy)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    And,
}

/// Elementwise unary ops.
#[derive(Clone, Copy)]
pub enum UnaryOp {
    Exp,
    Log,
    Rsqrt,
    Sqrt,
    Tanh,
    Logistic,
    Neg,
    Abs,
    Erf,
}

/// Comparison directions.
#[derive(Clone, Copy)]
pub enum Comparison {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy)]
pub enum Reduce {
    Sum,
    Max,
}

/// One `func.func` being built.
pub struct Func {
    name: String,
    args: Vec<Value>,
    /// For each argument, the result it is the storage of (`iree.abi.output`), if any.
    outputs: Vec<Option<usize>>,
    body: String,
    next: usize,
    results: Vec<Value>,
    products: Products,
}

/// How [`Func::linear_t`] writes a product of a few rows (up to [`PRODUCT_ROWS`]) by a weight.
/// One row is always a matrix-vector product over the weight as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// `x · wᵀ`, one matrix product: the form the CPU path's compile flags were measured with.
    #[default]
    RowMajor,
    /// `(w · xᵀ)ᵀ`: the weight's rows as the product's long dimension.
    WeightMajor,
    /// Up to [`MATVEC_ROWS`] rows as one matrix-vector product each, over the weight as stored;
    /// more as [`Products::WeightMajor`].
    RowMatvecs,
    /// The module's weights declared in tiles, packed once at upload, and every product by them
    /// IREE's four-dimensional one, whatever its rows ([`crate::iree::tiles`]); products by
    /// values of the call (LoRA's, through their rank) as [`Products::RowMajor`]; the tiles
    /// shaped for the target's vector registers.
    Tiles(crate::iree::tiles::TileShape),
}

/// The most rows [`Products::RowMatvecs`] writes as matrix-vector products.
pub const MATVEC_ROWS: usize = 8;

impl Func {
    pub fn new(name: &str) -> Self {
        Func {
            name: name.into(),
            args: Vec::new(),
            outputs: Vec::new(),
            body: String::new(),
            next: 0,
            results: Vec::new(),
            products: Products::default(),
        }
    }

    /// The same function with its few-row products written as `products` says.
    pub fn with_products(mut self, products: Products) -> Self {
        self.products = products;
        self
    }

    /// How this function writes its few-row products.
    pub fn products(&self) -> Products {
        self.products
    }

    /// Declares the next function argument.
    pub fn arg(&mut self, ty: TensorType) -> Value {
        let v = Value {
            name: format!("%arg{}", self.args.len()),
            ty,
        };
        self.args.push(v.clone());
        self.outputs.push(None);
        v
    }

    /// Declares the next argument as the storage of result `result` (`iree.abi.output`): IREE
    /// writes that result into the caller's buffer instead of allocating a new one, so a value
    /// the function updates (a KV cache) is updated in place. Without it IREE must assume the
    /// caller still needs the argument as it was, and copies it into a fresh result on every
    /// call. The caller must not pass one buffer as two such arguments.
    pub fn output_arg(&mut self, ty: TensorType, result: usize) -> Value {
        let v = self.arg(ty);
        *self.outputs.last_mut().expect("just declared") = Some(result);
        v
    }

    pub fn ret(&mut self, results: Vec<Value>) {
        self.results = results;
    }

    /// A new SSA name of type `ty`.
    pub(super) fn fresh(&mut self, ty: TensorType) -> Value {
        let v = Value {
            name: format!("%{}", self.next),
            ty,
        };
        self.next += 1;
        v
    }

    /// Appends one line of MLIR to the body (for ops this builder does not print generically).
    pub(super) fn line(&mut self, text: &str) {
        writeln!(self.body, "    {text}").unwrap();
    }

    /// Emits `%r = "op"(operands) {attrs} : (types) -> type`.
    fn op(&mut self, op: &str, operands: &[&Value], attrs: &str, out: TensorType) -> Value {
        let r = self.fresh(out);
        let names: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        let tys: Vec<String> = operands.iter().map(|v| v.ty.to_string()).collect();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        writeln!(
            self.body,
            "    {} = \"stablehlo.{op}\"({}){attrs} : ({}) -> {}",
            r.name,
            names.join(", "),
            tys.join(", "),
            r.ty
        )
        .unwrap();
        r
    }

    // ----- constants and shapes -------------------------------------------------------------

    /// A tensor filled with one f32 value.
    pub fn splat(&mut self, value: f32, shape: &[usize]) -> Value {
        let ty = TensorType::f32(shape);
        // Hex bit pattern: exact, and covers infinities.
        let attrs = format!("value = dense<0x{:08X}> : {ty}", value.to_bits());
        self.constant(&attrs, ty)
    }

    pub fn splat_i32(&mut self, value: i32, shape: &[usize]) -> Value {
        let ty = TensorType::i32(shape);
        let attrs = format!("value = dense<{value}> : {ty}");
        self.constant(&attrs, ty)
    }

    /// A 1-D f32 constant with the given values.
    pub fn const_f32(&mut self, values: &[f32]) -> Value {
        let ty = TensorType::f32(&[values.len()]);
        let body: Vec<String> = values
            .iter()
            .map(|v| format!("0x{:08X}", v.to_bits()))
            .collect();
        let attrs = format!("value = dense<[{}]> : {ty}", body.join(", "));
        self.constant(&attrs, ty)
    }

    fn constant(&mut self, attrs: &str, ty: TensorType) -> Value {
        let r = self.fresh(ty);
        writeln!(
            self.body,
            "    {} = \"stablehlo.constant\"() {{{attrs}}} : () -> {}",
            r.name, r.ty
        )
        .unwrap();
        r
    }

    pub fn iota(&mut self, shape: &[usize], dim: usize, dtype: DType) -> Value {
        self.op(
            "iota",
            &[],
            &format!("iota_dimension = {dim} : i64"),
            TensorType::new(shape, dtype),
        )
    }

    pub fn reshape(&mut self, x: &Value, shape: &[usize]) -> Value {
        let ty = TensorType::new(shape, x.ty.dtype);
        assert_eq!(ty.numel(), x.ty.numel(), "reshape {} → {ty}", x.ty);
        self.op("reshape", &[x], "", ty)
    }

    /// `x` unchanged, but IREE may not fuse its producers into its consumers: it is computed
    /// once, in its own dispatch, and each consumer reads it.
    pub fn barrier(&mut self, x: &Value) -> Value {
        self.op("optimization_barrier", &[x], "", x.ty.clone())
    }

    pub fn transpose(&mut self, x: &Value, perm: &[usize]) -> Value {
        assert_eq!(perm.len(), x.ty.rank(), "transpose rank");
        let shape: Vec<usize> = perm.iter().map(|&p| x.dim(p)).collect();
        self.op(
            "transpose",
            &[x],
            &format!("permutation = {}", arr(perm)),
            TensorType::new(&shape, x.ty.dtype),
        )
    }

    /// Broadcasts `x` to `shape`, `dims[i]` being the output dimension of `x`'s dimension i.
    pub fn broadcast(&mut self, x: &Value, shape: &[usize], dims: &[usize]) -> Value {
        assert_eq!(dims.len(), x.ty.rank(), "broadcast dims");
        for (i, &d) in dims.iter().enumerate() {
            assert!(
                x.dim(i) == shape[d] || x.dim(i) == 1,
                "broadcast {} → {shape:?}",
                x.ty
            );
        }
        self.op(
            "broadcast_in_dim",
            &[x],
            &format!("broadcast_dimensions = {}", arr(dims)),
            TensorType::new(shape, x.ty.dtype),
        )
    }

    /// Broadcasts `x` along new leading dimensions (numpy-style trailing alignment).
    pub fn broadcast_trailing(&mut self, x: &Value, shape: &[usize]) -> Value {
        if x.shape() == shape {
            return x.clone();
        }
        let off = shape.len() - x.ty.rank();
        let dims: Vec<usize> = (off..shape.len()).collect();
        self.broadcast(x, shape, &dims)
    }

    pub fn slice(&mut self, x: &Value, start: &[usize], limit: &[usize]) -> Value {
        let strides = vec![1; start.len()];
        self.slice_strided(x, start, limit, &strides)
    }

    pub fn slice_strided(
        &mut self,
        x: &Value,
        start: &[usize],
        limit: &[usize],
        strides: &[usize],
    ) -> Value {
        let shape: Vec<usize> = (0..start.len())
            .map(|i| {
                assert!(
                    limit[i] <= x.dim(i) && start[i] <= limit[i],
                    "slice of {}",
                    x.ty
                );
                (limit[i] - start[i]).div_ceil(strides[i])
            })
            .collect();
        self.op(
            "slice",
            &[x],
            &format!(
                "start_indices = {}, limit_indices = {}, strides = {}",
                arr(start),
                arr(limit),
                arr(strides)
            ),
            TensorType::new(&shape, x.ty.dtype),
        )
    }

    /// Slice along one dimension.
    pub fn slice_dim(&mut self, x: &Value, dim: usize, start: usize, limit: usize) -> Value {
        let mut s = vec![0; x.ty.rank()];
        let mut l = x.shape().to_vec();
        s[dim] = start;
        l[dim] = limit;
        self.slice(x, &s, &l)
    }

    pub fn concat(&mut self, xs: &[&Value], dim: usize) -> Value {
        let mut shape = xs[0].shape().to_vec();
        shape[dim] = xs.iter().map(|x| x.dim(dim)).sum();
        self.op(
            "concatenate",
            xs,
            &format!("dimension = {dim} : i64"),
            TensorType::new(&shape, xs[0].ty.dtype),
        )
    }

    pub fn convert(&mut self, x: &Value, dtype: DType) -> Value {
        if x.ty.dtype == dtype {
            return x.clone();
        }
        self.op("convert", &[x], "", x.ty.with_dtype(dtype))
    }

    /// Reinterprets bits (i16 ↔ bf16): weights travel as raw 16-bit words.
    pub fn bitcast(&mut self, x: &Value, dtype: DType) -> Value {
        self.op("bitcast_convert", &[x], "", x.ty.with_dtype(dtype))
    }

    /// `tensor<i32>` scalar from a 1-element slice of a 1-D i32 tensor.
    pub fn scalar_at(&mut self, x: &Value, i: usize) -> Value {
        let s = self.slice(x, &[i], &[i + 1]);
        self.reshape(&s, &[])
    }

    pub fn dynamic_slice(&mut self, x: &Value, starts: &[&Value], sizes: &[usize]) -> Value {
        let mut ops: Vec<&Value> = vec![x];
        ops.extend_from_slice(starts);
        self.op(
            "dynamic_slice",
            &ops,
            &format!("slice_sizes = {}", arr(sizes)),
            TensorType::new(sizes, x.ty.dtype),
        )
    }

    /// `table[idx, :]` for a 2-D `table` and an i32 index tensor of any shape → `[idx…, k]`: one
    /// gathered row per index, exact, and nothing the size of a one-hot of the indices.
    pub fn take_rows(&mut self, table: &Value, idx: &Value) -> Value {
        let r = idx.ty.rank();
        let k = table.dim(1);
        let mut with_vector = idx.shape().to_vec();
        with_vector.push(1);
        let idx = self.reshape(idx, &with_vector);
        let mut out = with_vector[..r].to_vec();
        out.push(k);
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<offset_dims = [{r}], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {r}>, indices_are_sorted = false, slice_sizes = array<i64: 1, {k}>"
        );
        self.op(
            "gather",
            &[table, &idx],
            &attrs,
            TensorType::new(&out, table.ty.dtype),
        )
    }

    pub fn dynamic_update_slice(&mut self, x: &Value, update: &Value, starts: &[&Value]) -> Value {
        let mut ops: Vec<&Value> = vec![x, update];
        ops.extend_from_slice(starts);
        self.op("dynamic_update_slice", &ops, "", x.ty.clone())
    }

    // ----- elementwise ----------------------------------------------------------------------

    /// Elementwise binary op; a lower-rank operand is broadcast along leading dimensions.
    pub fn binary(&mut self, op: BinaryOp, a: &Value, b: &Value) -> Value {
        let (a, b) = if a.ty.rank() >= b.ty.rank() {
            let b = self.broadcast_trailing(b, a.shape());
            (a.clone(), b)
        } else {
            let a = self.broadcast_trailing(a, b.shape());
            (a, b.clone())
        };
        assert_eq!(a.shape(), b.shape(), "elementwise shapes");
        let name = match op {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "subtract",
            BinaryOp::Mul => "multiply",
            BinaryOp::Div => "divide",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Pow => "power",
            BinaryOp::And => "and",
        };
        let ty = a.ty.clone();
        self.op(name, &[&a, &b], "", ty)
    }

    pub fn add(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(BinaryOp::Add, a, b)
    }

    pub fn sub(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(BinaryOp::Sub, a, b)
    }

    pub fn mul(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub fn div(&mut self, a: &Value, b: &Value) -> Value {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `x · s` for a scalar constant.
    pub fn scale(&mut self, x: &Value, s: f32) -> Value {
        let c = self.splat(s, &[]);
        let c = self.broadcast(&c, &x.ty.shape.clone(), &[]);
        self.mul(x, &c)
    }

    /// `x + s` for a scalar constant.
    pub fn add_scalar(&mut self, x: &Value, s: f32) -> Value {
        let c = self.splat(s, &[]);
        let c = self.broadcast(&c, &x.ty.shape.clone(), &[]);
        self.add(x, &c)
    }

    pub fn unary(&mut self, op: UnaryOp, x: &Value) -> Value {
        if let UnaryOp::Erf = op {
            return self.erf(x);
        }
        let name = match op {
            UnaryOp::Exp => "exponential",
            UnaryOp::Log => "log",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Neg => "negate",
            UnaryOp::Abs => "abs",
            UnaryOp::Erf => unreachable!(),
        };
        self.op(name, &[x], "", x.ty.clone())
    }

    /// `chlo.erf` (StableHLO has no erf; IREE lowers the CHLO op).
    fn erf(&mut self, x: &Value) -> Value {
        let r = self.fresh(x.ty.clone());
        writeln!(
            self.body,
            "    {} = \"chlo.erf\"({}) : ({}) -> {}",
            r.name, x.name, x.ty, r.ty
        )
        .unwrap();
        r
    }

    pub fn compare(&mut self, a: &Value, b: &Value, dir: Comparison) -> Value {
        assert_eq!(a.shape(), b.shape(), "compare shapes");
        let d = match dir {
            Comparison::Eq => "EQ",
            Comparison::Ne => "NE",
            Comparison::Lt => "LT",
            Comparison::Le => "LE",
            Comparison::Gt => "GT",
            Comparison::Ge => "GE",
        };
        self.op(
            "compare",
            &[a, b],
            &format!("comparison_direction = #stablehlo<comparison_direction {d}>"),
            a.ty.with_dtype(DType::I1),
        )
    }

    pub fn select(&mut self, pred: &Value, a: &Value, b: &Value) -> Value {
        assert_eq!(a.shape(), b.shape(), "select shapes");
        let pred = self.broadcast_trailing(pred, a.shape());
        self.op("select", &[&pred, a, b], "", a.ty.clone())
    }

    // ----- reductions and contractions ------------------------------------------------------

    /// Reduces `x` over `dims` (f32).
    pub fn reduce(&mut self, x: &Value, dims: &[usize], kind: Reduce) -> Value {
        let init = match kind {
            Reduce::Sum => self.splat(0.0, &[]),
            Reduce::Max => self.splat(f32::NEG_INFINITY, &[]),
        };
        let shape: Vec<usize> = (0..x.ty.rank())
            .filter(|d| !dims.contains(d))
            .map(|d| x.dim(d))
            .collect();
        let out = TensorType::new(&shape, x.ty.dtype);
        let r = self.fresh(out);
        let (a, b) = (self.next, self.next + 1);
        let c = self.next + 2;
        self.next += 3;
        let s = format!("tensor<{}>", x.ty.dtype.mlir());
        let op = match kind {
            Reduce::Sum => "add",
            Reduce::Max => "maximum",
        };
        writeln!(
            self.body,
            "    {} = \"stablehlo.reduce\"({}, {}) ({{\n    ^bb0(%{a}: {s}, %{b}: {s}):\n      %{c} = \"stablehlo.{op}\"(%{a}, %{b}) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%{c}) : ({s}) -> ()\n    }}) {{dimensions = {}}} : ({}, {s}) -> {}",
            r.name, x.name, init.name, arr(dims), x.ty, r.ty
        )
        .unwrap();
        r
    }

    /// General contraction. Output dims: batch, then lhs free, then rhs free (StableHLO order).
    pub fn dot_general(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
    ) -> Value {
        for (&i, &j) in batch
            .0
            .iter()
            .zip(batch.1)
            .chain(contract.0.iter().zip(contract.1))
        {
            assert_eq!(a.dim(i), b.dim(j), "dot_general {} · {}", a.ty, b.ty);
        }
        let mut shape: Vec<usize> = batch.0.iter().map(|&i| a.dim(i)).collect();
        shape.extend(
            (0..a.ty.rank())
                .filter(|d| !batch.0.contains(d) && !contract.0.contains(d))
                .map(|d| a.dim(d)),
        );
        shape.extend(
            (0..b.ty.rank())
                .filter(|d| !batch.1.contains(d) && !contract.1.contains(d))
                .map(|d| b.dim(d)),
        );
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [{}], rhs_batching_dimensions = [{}], lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
            list(batch.0),
            list(batch.1),
            list(contract.0),
            list(contract.1)
        );
        self.op("dot_general", &[a, b], &attrs, TensorType::f32(&shape))
    }

    /// `x · wᵀ` for `x` `[.., k]` and a PyTorch-layout weight `w` `[n, k]` → `[.., n]`; more
    /// than [`PRODUCT_ROWS`] rows go as several products.
    pub fn linear_t(&mut self, x: &Value, w: &Value) -> Value {
        let r = x.ty.rank();
        let lead: Vec<usize> = x.shape()[..r - 1].to_vec();
        let k = x.dim(r - 1);
        let rows: usize = lead.iter().product();
        let x2 = self.reshape(x, &[rows, k]);
        // One row as `w · x` (a matrix-vector product that reads `w` as stored). Written as
        // `x · wᵀ`, IREE lowers it to a vector-matrix product over a transposed copy of `w`,
        // made on every call: each decode step copied every weight once.
        let y = if rows == 1 {
            let y = self.dot_general(w, &x2, (&[], &[]), (&[1], &[1]));
            self.reshape(&y, &[1, w.dim(0)])
        } else if rows > PRODUCT_ROWS {
            // Blocks of at most PRODUCT_ROWS rows, each its own product (see there why).
            let blocks = rows.div_ceil(PRODUCT_ROWS);
            let block = rows.div_ceil(blocks).next_multiple_of(16);
            let parts: Vec<Value> = (0..rows)
                .step_by(block)
                .map(|r0| {
                    let xb = self.slice(&x2, &[r0, 0], &[(r0 + block).min(rows), k]);
                    self.dot_general(&xb, w, (&[], &[]), (&[1], &[1]))
                })
                .collect();
            let parts: Vec<&Value> = parts.iter().collect();
            self.concat(&parts, 0)
        } else {
            let form = match self.products {
                Products::RowMatvecs if rows > MATVEC_ROWS => Products::WeightMajor,
                p => p,
            };
            match form {
                Products::RowMajor | Products::Tiles(_) => {
                    self.dot_general(&x2, w, (&[], &[]), (&[1], &[1]))
                }
                Products::WeightMajor => {
                    let yt = self.dot_general(w, &x2, (&[], &[]), (&[1], &[1]));
                    self.transpose(&yt, &[1, 0])
                }
                Products::RowMatvecs => {
                    let n = w.dim(0);
                    let parts: Vec<Value> = (0..rows)
                        .map(|r0| {
                            let xr = self.slice(&x2, &[r0, 0], &[r0 + 1, k]);
                            let y = self.dot_general(w, &xr, (&[], &[]), (&[1], &[1]));
                            self.reshape(&y, &[1, n])
                        })
                        .collect();
                    let parts: Vec<&Value> = parts.iter().collect();
                    self.concat(&parts, 0)
                }
            }
        };
        let mut shape = lead;
        shape.push(w.dim(0));
        self.reshape(&y, &shape)
    }

    /// Softmax over the last dimension (max-subtracted, like the host kernel).
    pub fn softmax_last(&mut self, x: &Value) -> Value {
        let r = x.ty.rank();
        let m = self.reduce(x, &[r - 1], Reduce::Max);
        let e = self.exp_minus_rows(x, &m);
        let s = self.reduce(&e, &[r - 1], Reduce::Sum);
        self.scale_rows_by_inverse(&e, &s)
    }

    /// `exp(x − m)`, `m` holding one value per row of the last dimension.
    pub fn exp_minus_rows(&mut self, x: &Value, m: &Value) -> Value {
        let keep: Vec<usize> = (0..x.ty.rank() - 1).collect();
        let m = self.broadcast(m, x.shape(), &keep);
        let e = self.sub(x, &m);
        self.unary(UnaryOp::Exp, &e)
    }

    /// `e · (1 / s)`, `s` holding one sum per row of the last dimension: a softmax's last step,
    /// as the host kernel does it. Written as `e / s`, IREE recognises the whole softmax and
    /// tiles it so that every tile of the output recomputes its rows' max and sum: 16 × 500 × 500
    /// took 116 ms on one thread against 8 ms this way (`docs/benchmarks.md`).
    pub fn scale_rows_by_inverse(&mut self, e: &Value, s: &Value) -> Value {
        let keep: Vec<usize> = (0..e.ty.rank() - 1).collect();
        let one = self.splat(1.0, s.shape());
        let inv = self.div(&one, s);
        let inv = self.broadcast(&inv, e.shape(), &keep);
        self.mul(e, &inv)
    }

    /// Mean over the last dimension, broadcast back to `x`'s shape.
    pub fn mean_last_bcast(&mut self, x: &Value) -> Value {
        let r = x.ty.rank();
        let shape = x.shape().to_vec();
        let n = x.dim(r - 1) as f32;
        let s = self.reduce(x, &[r - 1], Reduce::Sum);
        let s = self.scale(&s, 1.0 / n);
        let keep: Vec<usize> = (0..r - 1).collect();
        self.broadcast(&s, &shape, &keep)
    }

    /// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w`.
    pub fn rms_norm(&mut self, x: &Value, w: &Value, eps: f32) -> Value {
        let sq = self.mul(x, x);
        let ms = self.mean_last_bcast(&sq);
        let ms = self.add_scalar(&ms, eps);
        let inv = self.unary(UnaryOp::Rsqrt, &ms);
        let y = self.mul(x, &inv);
        self.mul(&y, w)
    }

    /// LayerNorm over the last dimension with weight and bias.
    pub fn layer_norm(&mut self, x: &Value, w: &Value, b: &Value, eps: f32) -> Value {
        let mean = self.mean_last_bcast(x);
        let d = self.sub(x, &mean);
        let sq = self.mul(&d, &d);
        let var = self.mean_last_bcast(&sq);
        let var = self.add_scalar(&var, eps);
        let inv = self.unary(UnaryOp::Rsqrt, &var);
        let y = self.mul(&d, &inv);
        let y = self.mul(&y, w);
        self.add(&y, b)
    }

    /// `x · sigmoid(x)`.
    pub fn silu(&mut self, x: &Value) -> Value {
        let s = self.unary(UnaryOp::Logistic, x);
        self.mul(x, &s)
    }

    /// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    pub fn gelu_tanh(&mut self, x: &Value) -> Value {
        let x3 = self.mul(x, x);
        let x3 = self.mul(&x3, x);
        let inner = self.scale(&x3, 0.044715);
        let inner = self.add(x, &inner);
        let inner = self.scale(&inner, (2.0f32 / std::f32::consts::PI).sqrt());
        let t = self.unary(UnaryOp::Tanh, &inner);
        let t = self.add_scalar(&t, 1.0);
        let y = self.mul(x, &t);
        self.scale(&y, 0.5)
    }

    /// GELU, exact: `0.5·x·(1 + erf(x/√2))`.
    pub fn gelu_erf(&mut self, x: &Value) -> Value {
        let t = self.scale(x, std::f32::consts::FRAC_1_SQRT_2);
        let t = self.unary(UnaryOp::Erf, &t);
        let t = self.add_scalar(&t, 1.0);
        let y = self.mul(x, &t);
        self.scale(&y, 0.5)
    }

    /// Convolution with the channels last (`[batch, spatial…, feature]`; weights as PyTorch
    /// stores them, `[out, in/groups, spatial…]`), so that a pointwise convolution that follows
    /// is a plain matrix product over rows of contiguous channels.
    pub fn conv(
        &mut self,
        x: &Value,
        w: &Value,
        strides: &[usize],
        padding: &[(usize, usize)],
        groups: usize,
    ) -> Value {
        let sp = strides.len();
        assert_eq!(x.ty.rank(), sp + 2, "conv input rank");
        assert_eq!(w.ty.rank(), sp + 2, "conv weight rank");
        assert_eq!(x.dim(sp + 1), w.dim(1) * groups, "conv channels");
        let mut shape = vec![x.dim(0)];
        for i in 0..sp {
            let n = x.dim(1 + i) + padding[i].0 + padding[i].1;
            shape.push((n - w.dim(2 + i)) / strides[i] + 1);
        }
        shape.push(w.dim(0));
        let (cin, cout) = (x.dim(sp + 1), w.dim(0));
        let one_input_channel_each = w.dim(1) == 1 && (cin == 1 || (groups == cin && cout == cin));
        if one_input_channel_each {
            return self.conv_by_taps(x, w, strides, padding, &shape);
        }
        let spatial: Vec<String> = (0..sp).map(|i| i.to_string()).collect();
        let s = spatial.join(", ");
        let pad: Vec<String> = padding.iter().map(|(a, b)| format!("[{a}, {b}]")).collect();
        let attrs = format!(
            "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, {s}, f]x[o, i, {s}]->[b, {s}, f]>, feature_group_count = {groups} : i64, padding = dense<[{}]> : tensor<{sp}x2xi64>, window_strides = {}",
            pad.join(", "),
            arr(strides)
        );
        self.op("convolution", &[x, w], &attrs, TensorType::f32(&shape))
    }

    /// A convolution whose every output channel reads one input channel (a one-channel input,
    /// or depthwise), built from its kernel taps: each tap is a strided slice of the padded
    /// input. IREE lowers such a `stablehlo.convolution` to a generic loop nest: the audio
    /// subsampler's first convolution (one channel in, 1024 out, 3 × 3, stride 2 over 1040 × 80)
    /// took 103 ms a call that way, for 0.2 GMAC (`docs/benchmarks.md`).
    ///
    /// - One input channel: the taps side by side are the im2col matrix `[positions, taps]`, and
    ///   the convolution is its product with the weights `[out, taps]`.
    /// - Depthwise: each tap's slice times that tap's per-channel weight, summed over the taps
    ///   in one elementwise pass (an im2col matrix would be taps × the input).
    fn conv_by_taps(
        &mut self,
        x: &Value,
        w: &Value,
        strides: &[usize],
        padding: &[(usize, usize)],
        shape: &[usize],
    ) -> Value {
        let sp = strides.len();
        let (cin, cout) = (x.dim(sp + 1), w.dim(0));
        let x = self.pad(x, &[&[(0, 0)], padding, &[(0, 0)]].concat());
        let kernel: Vec<Vec<usize>> = (0..sp).fold(vec![vec![]], |acc, i| {
            acc.iter()
                .flat_map(|t| (0..w.dim(2 + i)).map(move |k| [t.clone(), vec![k]].concat()))
                .collect()
        });
        // Tap `k` of every output position: `[batch, out…, cin]`.
        let taps: Vec<Value> = kernel
            .iter()
            .map(|k| {
                let mut start = vec![0];
                let mut limit = vec![x.dim(0)];
                let mut step = vec![1];
                for i in 0..sp {
                    start.push(k[i]);
                    limit.push(k[i] + (shape[1 + i] - 1) * strides[i] + 1);
                    step.push(strides[i]);
                }
                start.push(0);
                limit.push(cin);
                step.push(1);
                self.slice_strided(&x, &start, &limit, &step)
            })
            .collect();
        let w_taps = self.reshape(w, &[cout, kernel.len()]);
        if cin == 1 {
            let taps: Vec<&Value> = taps.iter().collect();
            let cols = self.concat(&taps, sp + 1);
            let positions = shape[..=sp].iter().product();
            let cols = self.reshape(&cols, &[positions, kernel.len()]);
            let y = self.linear_t(&cols, &w_taps);
            return self.reshape(&y, shape);
        }
        // `[tap, channel]`, so that each tap's weights are contiguous along the channels the
        // output vectorises over (as stored they are a kernel's size apart).
        let w_taps = self.transpose(&w_taps, &[1, 0]);
        let mut sum: Option<Value> = None;
        for (t, xs) in taps.iter().enumerate() {
            let wt = self.slice(&w_taps, &[t, 0], &[t + 1, cout]);
            let wt = self.reshape(&wt, &[cout]);
            let wt = self.broadcast(&wt, shape, &[sp + 1]);
            let term = self.mul(xs, &wt);
            sum = Some(match sum {
                None => term,
                Some(acc) => self.add(&acc, &term),
            });
        }
        sum.expect("a kernel has at least one tap")
    }

    /// Zero padding, `(low, high)` per dimension.
    pub fn pad(&mut self, x: &Value, edges: &[(usize, usize)]) -> Value {
        assert_eq!(edges.len(), x.ty.rank(), "pad rank");
        if edges.iter().all(|&e| e == (0, 0)) {
            return x.clone();
        }
        let zero = match x.ty.dtype {
            DType::F32 => self.splat(0.0, &[]),
            other => panic!("pad of {other:?}"),
        };
        let shape: Vec<usize> = (0..edges.len())
            .map(|i| x.dim(i) + edges[i].0 + edges[i].1)
            .collect();
        let low: Vec<usize> = edges.iter().map(|e| e.0).collect();
        let high: Vec<usize> = edges.iter().map(|e| e.1).collect();
        let attrs = format!(
            "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
            arr(&low),
            arr(&high),
            arr(&vec![0; edges.len()])
        );
        self.op(
            "pad",
            &[x, &zero],
            &attrs,
            TensorType::new(&shape, x.ty.dtype),
        )
    }

    /// Prints the function.
    pub fn finish(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .zip(&self.outputs)
            .map(|(a, out)| match out {
                Some(r) => {
                    let result = self.results.get(*r);
                    assert!(
                        result.is_some_and(|res| res.ty == a.ty),
                        "{}: {} is the storage of result {r}, which is {:?}",
                        self.name,
                        a.name,
                        result.map(|res| res.ty.to_string())
                    );
                    format!("{}: {} {{iree.abi.output = {r} : index}}", a.name, a.ty)
                }
                None => format!("{}: {}", a.name, a.ty),
            })
            .collect();
        let rtys: Vec<String> = self.results.iter().map(|r| r.ty.to_string()).collect();
        let rnames: Vec<&str> = self.results.iter().map(|r| r.name.as_str()).collect();
        format!(
            "  func.func @{}({}) -> ({}) {{\n{}    \"func.return\"({}) : ({}) -> ()\n  }}\n",
            self.name,
            args.join(", "),
            rtys.join(", "),
            self.body,
            rnames.join(", "),
            rtys.join(", ")
        )
    }
}

/// A module of functions; called from the runtime as `<module>.<func>`.
pub fn module(name: &str, funcs: &[Func]) -> String {
    let mut s = format!("module @{name} {{\n");
    for f in funcs {
        s.push_str(&f.finish());
    }
    s.push_str("}\n");
    s
}
