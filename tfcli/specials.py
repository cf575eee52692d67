"""Special tokens, fixed across tfcli (torch-free, so data tools import it cheaply).

Every tokenizer is trained with these four first, so their ids are the same in every model and prepared directory.
"""

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
