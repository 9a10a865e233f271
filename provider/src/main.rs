fn main() {
    println!("cluster-api-provider-libvirt {}", env!("CARGO_PKG_VERSION"));
}
