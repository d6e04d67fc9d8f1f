"""int8 quantization (placeholder: the quantization pass replaces this module)."""
