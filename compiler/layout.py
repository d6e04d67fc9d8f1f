"""Packed tensor layouts (placeholder: the layout-packing pass replaces this module)."""


def transform_shape(shape, src, dst, channels=None):
    raise ValueError(f"layout transforms are not implemented yet ({src} -> {dst})")
