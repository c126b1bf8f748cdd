"""flashspec_suffix plugin: the SuffixDecoding draft (``use = "suffix"``)."""
