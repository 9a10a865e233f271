fn main() {
    println!("xtask");
}
