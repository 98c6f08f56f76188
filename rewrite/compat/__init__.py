"""Porting aids for scripts written against other graph compilers."""
