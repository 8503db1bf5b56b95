"""Instruction versus material, and language-independent shape signals of a prompt.

* ``split_instruction(text)`` separates pasted or quoted *material* (a passage, an article,
  a specification) from the *instruction* that asks something about it: the lines after the
  last long line, or, for one long block of prose, its final sentence.  Prompts without a long
  line are all instruction.  The features hash the instruction's words and describe the
  material only by its size and shape, so a long passage does not make a one-line question
  look hard, nor its vocabulary leak the source it came from.
* ``TECH_TERMS`` / ``cjk_tech_terms``: programming terms (language, library and data
  structure names; a short multilingual glossary of programming nouns), a sign of code
  intent in short requests in any language.  The other code and maths shape signals are
  token classes (``features.token_class``), so the scorer counts them from its word cache.

Everything is a pure function of the text: the same code serves training and scoring.
"""

from __future__ import annotations

import re
from typing import Final

LONG_LINE: Final = 200
LONG_BLOCK: Final = 600
_SENTENCE_END_RE: Final = re.compile(r"[.!?\u3002\uff01\uff1f\u061f](?:[\"')\]\u300d]*)\s+(?=\S)")
# Signs that wrapped text is code, not prose (plain substring checks: they are cheap).
_CODE_MARKS: Final = ("```", "{", "}", ";\n", "\n    ", "\n\t", "def ", "import ", "#include")
# fmt: off
# Programming languages, tools and libraries, and generic programming nouns.  Matched as whole
# lowercased tokens; the non-Latin glossary entries are matched as substrings (scripts such
# as Japanese do not separate words with spaces).
TECH_TERMS: Final = frozenset((
    "python", "java", "javascript", "typescript", "cpp", "golang", "rust", "ruby", "php",
    "perl", "swift", "kotlin", "scala", "haskell", "lua",
    "bash", "shell", "powershell", "sql", "mysql", "postgres", "postgresql", "sqlite", "html",
    "css", "regex", "regexp", "json", "xml", "yaml", "csv", "api", "http", "url", "unicode",
    "utf", "ascii", "numpy", "pandas", "django", "flask", "matplotlib", "scipy", "sklearn",
    "tensorflow", "pytorch", "torch", "jquery", "react", "node", "npm", "pip", "git", "linux",
    "unix", "windows", "excel", "vba", "dataframe", "dict", "dictionary", "dictionaries",
    "list", "lists", "array", "arrays", "tuple", "tuples", "string", "strings", "integer",
    "float", "boolean", "bool", "function", "functions", "method", "class",
    "object", "variable", "loop", "iterate", "recursion", "recursive", "algorithm", "compile",
    "compiler", "debug", "bug", "exception", "error", "script", "code", "program", "library",
    "module", "import", "file", "files", "directory", "folder", "byte", "bytes", "hex",
    "binary", "socket", "thread", "query", "database", "column", "columns", "row", "rows",
    "index", "matrix", "lambda", "iterator", "generator", "datetime", "timestamp", "subprocess",
    # es / pt / fr / de / it
    "función", "funcion", "lista", "cadena", "arreglo", "archivo", "fichero", "diccionario",
    "bucle", "clase", "objeto", "variable", "código", "codigo", "programa", "matriz",
    "fonction", "chaîne", "tableau", "fichier", "dictionnaire", "boucle",
    "funktion", "liste", "zeichenkette", "datei", "schleife", "klasse", "wörterbuch",
    "arquivo", "dicionário", "laço", "classe", "stringa", "ciclo",
    # ru / uk
    "функция", "функции", "функцию", "список", "списка", "списке", "списков", "строка",
    "строки", "строку", "строк", "массив", "массива", "массиве", "файл", "файла", "файле",
    "файлов", "словарь", "словаря", "словаре", "цикл", "цикле", "класс", "класса", "объект",
    "переменная", "переменной", "код", "кода", "программа", "программы", "скрипт", "модуль",
    "библиотека", "матрица", "число", "числа", "символ", "символы", "строчку", "элемент",
    "элементы", "элементов", "запрос", "столбец", "таблица",

))
CJK_TECH_TERMS: Final = (
    "関数", "配列", "リスト", "文字列", "辞書", "ファイル", "変数", "クラス", "ループ",
    "コード", "プログラム", "モジュール", "ライブラリ", "正規表現", "要素", "行列", "整数",
    "函数", "数组", "列表", "字符串", "字典", "文件", "变量", "循环", "代码", "程序", "元素",
    "函數", "陣列", "字串", "檔案", "變數", "程式",
    "함수", "배열", "리스트", "문자열", "파일", "변수",
)
# fmt: on


def _looks_like_code(text: str) -> bool:
    return any(mark in text for mark in _CODE_MARKS)


def _last_sentence_start(block: str) -> int:
    """Offset where the final sentence of ``block`` begins (0 when it has one sentence)."""
    start = 0
    for match in _SENTENCE_END_RE.finditer(block, 0, max(0, len(block) - 1)):
        start = match.end()
    return start


def split_instruction(text: str) -> tuple[str, str]:
    """``(material, instruction)``: ``material + instruction`` covers ``text`` up to the
    whitespace at the cut, so their tokens are the tokens of ``text``.

    The cut is after the last line of at least ``LONG_LINE`` characters when shorter lines
    follow it; else before a short last line that follows at least ``LONG_BLOCK`` characters
    of text with nothing code-like in it (wrapped prose); else, for a single block of at least
    ``LONG_BLOCK`` characters, before its last sentence; else there is no material.
    """
    stripped = text.rstrip()
    if len(stripped) < LONG_LINE:
        return "", text  # nothing can be long enough to be material
    cut = -1
    pos = 0
    for line in stripped.split("\n"):
        end = pos + len(line)
        if len(line.strip()) >= LONG_LINE:
            cut = end
        pos = end + 1
    if 0 <= cut < len(stripped) and stripped[cut:].strip():
        return stripped[:cut], stripped[cut:]
    last = stripped.rfind("\n")
    if last >= LONG_BLOCK and len(stripped) - last <= LONG_LINE and not _looks_like_code(stripped):
        return stripped[:last], stripped[last:]
    if len(stripped) >= LONG_BLOCK and "\n" not in stripped.strip():
        start = _last_sentence_start(stripped)
        if start > 0:
            return stripped[:start], stripped[start:]
    return "", text


def cjk_tech_terms(text: str) -> int:
    """How many of ``CJK_TECH_TERMS`` occur in ``text`` (0 for ASCII text)."""
    return 0 if text.isascii() else sum(term in text for term in CJK_TECH_TERMS)
