"""The Edge-Node wire: generated protobuf messages and length-prefixed framing."""
