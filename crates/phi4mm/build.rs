#[path = "mlx_rpath.rs"]
mod mlx_rpath;

fn main() {
    mlx_rpath::emit();
}
