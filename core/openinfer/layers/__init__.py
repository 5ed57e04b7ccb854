"""Building blocks shared by several model lines (RoPE variants, GQA attention, SwiGLU)."""
