"""Short prompts in several languages and scripts, of both labels.

Code requests (how do I ... in <language>, a one-line programming task) are complex; small
talk and one-fact questions in the same languages are simple.  So the language or script of
a short prompt carries no label: only what it asks does.  All templates are written here.
"""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import one

# fmt: off
_CODE_LANGS = ("Python", "JavaScript", "Java", "C#", "Go", "Rust", "C++", "PHP", "Ruby",
               "TypeScript", "Kotlin", "SQL", "bash", "R", "Swift", "pandas", "numpy")
# Per natural language: request frames (with {lang} and {task}) and programming tasks.
_CODE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "es": (
        ("¿Cómo puedo {task} en {lang}?", "{lang}: {task}", "Cómo {task} con {lang}",
         "¿Hay alguna forma de {task} usando {lang}?", "necesito {task} en {lang}"),
        ("ordenar un diccionario por sus valores", "leer un archivo CSV línea por línea",
         "eliminar los duplicados de una lista", "convertir una cadena en fecha",
         "contar las ocurrencias de cada palabra", "unir dos listas sin repetir elementos",
         "validar un correo con una expresión regular", "invertir una cadena",
         "agrupar filas por columna y sumar", "hacer una petición HTTP con cabeceras",
         "recorrer un árbol de directorios", "pasar argumentos a un script"),
    ),
    "fr": (
        ("Comment {task} en {lang} ?", "{lang} : comment {task}", "Je veux {task} avec {lang}",
         "Quelle est la meilleure façon de {task} en {lang} ?"),
        ("trier une liste de dictionnaires par clé", "lire un fichier JSON",
         "supprimer les espaces d'une chaîne", "convertir un entier en binaire",
         "fusionner deux tableaux triés", "tester si une clé existe dans un dictionnaire",
         "extraire les nombres d'une chaîne", "écrire une fonction récursive de factorielle",
         "parcourir les fichiers d'un dossier", "arrondir un flottant à deux décimales"),
    ),
    "de": (
        ("Wie kann ich in {lang} {task}?", "{lang}: {task}", "Wie {task} mit {lang}?",
         "Beste Methode, um in {lang} {task}"),
        ("eine Liste nach Länge sortieren", "eine Datei zeilenweise einlesen",
         "doppelte Einträge aus einem Array entfernen", "einen String in eine Zahl umwandeln",
         "zwei Wörterbücher zusammenführen", "das aktuelle Datum formatieren",
         "eine Schleife rückwärts durchlaufen", "eine Klasse mit Konstruktor schreiben",
         "alle Zeilen einer Tabelle zählen", "eine Ausnahme sauber abfangen"),
    ),
    "pt": (
        ("Como {task} em {lang}?", "{lang} - como {task}", "Qual a forma de {task} no {lang}?",
         "preciso {task} em {lang}"),
        ("ordenar uma lista de objetos por atributo", "ler um arquivo de texto inteiro",
         "remover itens repetidos de um vetor", "transformar uma string em lista",
         "somar os valores de uma coluna", "criar um dicionário a partir de duas listas",
         "verificar se um número é primo", "baixar uma página da web",
         "formatar uma data no padrão dia/mês/ano", "dividir uma string por vírgula"),
    ),
    "ru": (
        ("Как {task} в {lang}?", "{lang}: как {task}", "Как на {lang} {task}?",
         "Подскажите, как {task} на {lang}"),
        ("отсортировать словарь по значению", "прочитать файл построчно",
         "удалить дубликаты из списка", "преобразовать строку в число",
         "объединить два списка", "найти индекс элемента в массиве",
         "разбить строку по пробелам", "записать данные в CSV файл",
         "получить текущую дату и время", "перевернуть строку", "вызвать функцию по таймеру"),
    ),
    "ja": (
        ("{lang}で{task}方法", "{lang}で{task}には？", "{lang}で{task}コードを教えて",
         "{lang}を使って{task}にはどうすればいいですか", "【{lang}】{task}"),
        ("リストを辞書に変換する", "ファイルを一行ずつ読み込む", "配列から重複を削除する",
         "文字列を日付に変換する", "辞書を値でソートする", "正規表現で数字を抜き出す",
         "二つのリストを結合する", "CSVファイルに書き出す", "文字列を逆順にする",
         "例外を捕まえる", "JSONを読み込む", "現在時刻を取得する"),
    ),
    "zh": (
        ("如何在{lang}中{task}？", "{lang}怎么{task}", "用{lang}{task}的方法", "{lang}：{task}"),
        ("对字典按值排序", "逐行读取文件", "删除列表中的重复元素", "把字符串转换成整数",
         "合并两个数组", "用正则表达式提取数字", "获取当前日期", "反转字符串",
         "把数据写入CSV文件", "发送HTTP请求"),
    ),
}
# Per natural language: simple small talk and one-fact questions.
_SIMPLE: dict[str, tuple[str, ...]] = {
    "es": ("Hola, ¿qué tal tu día?", "¿Cuál es la capital de Francia?", "buenos días!",
           "¿Cuántos días tiene una semana?", "¿De qué color es el cielo?",
           "¿Quién pintó la Mona Lisa?", "gracias por tu ayuda", "¿Qué hora es en Madrid?",
           "¿Cuál es tu comida favorita?", "¿Cuántas patas tiene una araña?"),
    "fr": ("Salut, ça va ?", "Quelle est la capitale de l'Italie ?", "bonne nuit !",
           "Combien de jours y a-t-il en février ?", "Tu aimes le café ?",
           "Qui a écrit Les Misérables ?", "merci beaucoup", "Quel temps fait-il aujourd'hui ?",
           "Quelle est la plus haute montagne du monde ?"),
    "de": ("Hallo, wie geht's?", "Was ist die Hauptstadt von Spanien?", "Guten Morgen!",
           "Wie viele Kontinente gibt es?", "Magst du Hunde oder Katzen lieber?",
           "Wer hat Faust geschrieben?", "danke dir", "Wie hoch ist die Zugspitze?",
           "Welche Farbe hat eine Banane?"),
    "pt": ("Oi, tudo bem?", "Qual é a capital do Japão?", "bom dia!",
           "Quantos meses tem um ano?", "Qual é o maior oceano do mundo?",
           "Quem descobriu o Brasil?", "obrigado!", "Você gosta de música?",
           "Em que continente fica o Egito?"),
    "ru": ("Привет! Как дела?", "Какая столица Германии?", "Доброе утро!",
           "Сколько дней в году?", "Кто написал «Евгения Онегина»?", "спасибо большое",
           "Какой твой любимый цвет?", "Сколько ног у кошки?", "Какая самая длинная река?"),
    "ja": ("こんにちは、元気ですか？", "日本の首都はどこですか", "おはよう！",
           "一年は何日ですか？", "富士山の高さは？", "ありがとう", "好きな食べ物は何？",
           "今日は何曜日？", "世界で一番大きい国は？", "猫と犬どっちが好き？"),
    "zh": ("你好，最近怎么样？", "中国的首都是哪里？", "早上好！", "一年有多少天？",
           "长城有多长？", "谢谢你", "你喜欢什么颜色？", "太阳从哪边升起？",
           "世界上最高的山是什么？"),
}
# fmt: on


def code_request(rng: Random) -> str:
    """A short programming request in one of several languages and scripts."""
    frames, tasks = _CODE[one(rng, sorted(_CODE))]
    text = one(rng, frames).format(lang=one(rng, _CODE_LANGS), task=one(rng, tasks))
    return text[0].upper() + text[1:] if rng.random() < 0.6 else text


def simple_short(rng: Random) -> str:
    """Small talk or a one-fact question in one of the same languages."""
    return one(rng, _SIMPLE[one(rng, sorted(_SIMPLE))])
