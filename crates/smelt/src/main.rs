fn main() {
    println!("smelt: not yet");
}
